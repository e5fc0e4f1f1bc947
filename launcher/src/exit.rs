//! How toporun ends: the exit codes, and the code and message for an error, decided
//! here from the error's type. A launch's own ends (a rank failed, restarts spent, the
//! file timer's 128 + signal) are decided by the agent's `job::transitions`.

use crate::facts_source;

/// Every rank of every node succeeded; a printing command ran (preflight: fit).
pub const SUCCESS: u8 = 0;
/// A rank failed with no restart left, the job was stopped, the rendezvous failed;
/// preflight found an error.
pub const FAILED: u8 = 1;
/// Usage: options or input toporun cannot run with (as argparse's exit 2).
pub const USAGE: u8 = 2;
/// `--preflight gate` found the host unfit: nothing was started.
pub const UNFIT: u8 = 3;

/// clap's own message; exit 2 for usage errors like torchrun, 0 for --help/--version.
pub fn usage(e: clap::Error) -> u8 {
    let _ = e.print();
    e.exit_code() as u8
}

/// Prints an error with its causes and returns the exit code: 2 when toporun could
/// not run at all (bad input), else 1.
pub fn report(err: &anyhow::Error) -> u8 {
    crate::console::say!("toporun: error: {err:#}");
    if err.downcast_ref::<facts_source::CannotRun>().is_some()
        || err
            .downcast_ref::<toporun_shared::torchrun::OptionsError>()
            .is_some_and(|e| e.exit_code() == 2)
        || err
            .downcast_ref::<toporun_agent::job::JobError>()
            .is_some_and(|e| e.exit_code() == 2)
    {
        USAGE
    } else {
        FAILED
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
