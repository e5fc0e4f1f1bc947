//! How toporun ends: the exit code and message for a usage error or a failure.

use crate::facts_source;

/// clap's own message; exit 2 for usage errors like torchrun, 0 for --help/--version.
pub fn usage(e: clap::Error) -> u8 {
    let _ = e.print();
    e.exit_code() as u8
}

/// Prints an error with its causes and returns the exit code: 2 when toporun could
/// not run at all (bad input), else 1.
pub fn report(err: &anyhow::Error) -> u8 {
    eprintln!("toporun: error: {err:#}");
    if err.downcast_ref::<facts_source::CannotRun>().is_some()
        || err
            .downcast_ref::<toporun_shared::torchrun::OptionsError>()
            .is_some_and(|e| e.exit_code() == 2)
        || err
            .downcast_ref::<toporun_agent::job::JobError>()
            .is_some_and(|e| e.exit_code() == 2)
    {
        2
    } else {
        1
    }
}

/// A printing command ends quietly when its reader goes away (`| head`), as coreutils
/// do: SIGPIPE's default action, instead of Rust's ignored SIGPIPE and a panic at
/// the next print. Not for a real launch, whose supervisor must outlive its console.
pub fn quiet_on_closed_pipe() {
    use nix::sys::signal::{signal, SigHandler, Signal};
    // SAFETY: SIG_DFL installs no handler code; nothing else relies on SIGPIPE's
    // disposition in a command that only prints.
    #[allow(unsafe_code)]
    unsafe {
        let _ = signal(Signal::SIGPIPE, SigHandler::SigDfl);
    }
}
