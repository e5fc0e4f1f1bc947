//! How toporun ends: one [`ExitStatus`] for every command, and the status of an
//! error, decided here from what its chain says. A launch's own ends (a rank failed,
//! restarts spent, a classified cause, the file timer's 128 + signal) are decided by
//! the agent's `job::transitions` and carried as [`ExitStatus::Job`].

use std::process::ExitCode;
use toporun_shared::root_cause::exit_codes;

/// How toporun ends; [`ExitStatus::code`] is the process's exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// Every rank of every node succeeded; a printing command ran (preflight: fit).
    Success,
    /// A command's own check failed (preflight found an error, nccl-log or fr-trace an
    /// issue), or an error that is not the input's: the rendezvous failed, a file
    /// could not be written.
    Failed,
    /// Options or input toporun cannot run with (as argparse's exit 2), or nothing
    /// to act on (no job runs here).
    Usage,
    /// `--preflight gate` found the host unfit: nothing was started.
    Unfit,
    /// A launch that ran ended with this code, as the job's state machine chose it.
    Job(u8),
    /// clap's own end: 0 for --help/--version, 2 for a usage error.
    Clap(u8),
}

impl ExitStatus {
    pub fn code(self) -> u8 {
        match self {
            ExitStatus::Success => exit_codes::SUCCESS,
            ExitStatus::Failed => exit_codes::FAILURE,
            ExitStatus::Usage => exit_codes::USAGE,
            ExitStatus::Unfit => exit_codes::GATE.code,
            ExitStatus::Job(code) | ExitStatus::Clap(code) => code,
        }
    }

    /// `Success` or, when `failed`, `Failed`.
    pub fn failed_if(failed: bool) -> ExitStatus {
        if failed {
            ExitStatus::Failed
        } else {
            ExitStatus::Success
        }
    }

    /// The status an error ends toporun with: `Usage` when an error in its chain says
    /// toporun could not run with its input, else `Failed`.
    pub fn of(err: &anyhow::Error) -> ExitStatus {
        if err.chain().any(is_usage) {
            return ExitStatus::Usage;
        }
        // A job error of a class of its own (a node the network check refused: 82).
        let classed = err
            .chain()
            .filter_map(|e| e.downcast_ref::<toporun_agent::job::JobError>())
            .map(toporun_agent::job::JobError::exit_code)
            .find(|c| *c != exit_codes::FAILURE);
        classed.map_or(ExitStatus::Failed, ExitStatus::Job)
    }
}

impl From<ExitStatus> for ExitCode {
    fn from(s: ExitStatus) -> ExitCode {
        ExitCode::from(s.code())
    }
}

/// Whether one error of a chain is a usage error: toporun's own [`CannotRun`], or
/// an options or job error that says it is (their crates cannot name this type).
fn is_usage(e: &(dyn std::error::Error + 'static)) -> bool {
    e.is::<CannotRun>()
        || e.downcast_ref::<toporun_shared::torchrun::OptionsError>()
            .is_some_and(|e| e.exit_code() == exit_codes::USAGE)
        || e.downcast_ref::<toporun_agent::job::JobError>()
            .is_some_and(|e| e.exit_code() == exit_codes::USAGE)
}

/// A command that cannot run at all (facts that cannot be read, an endpoint that is
/// no address, no job to ask): [`ExitStatus::Usage`], not a failure of the host.
#[derive(Debug)]
pub struct CannotRun(pub String);

impl std::fmt::Display for CannotRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CannotRun {}

/// clap's own message and end.
pub fn usage(e: clap::Error) -> ExitStatus {
    let _ = e.print();
    ExitStatus::Clap(u8::try_from(e.exit_code()).unwrap_or(2))
}

/// Prints an error with its causes; the status it ends toporun with.
pub fn report(err: &anyhow::Error) -> ExitStatus {
    crate::console::say!("toporun: error: {err:#}");
    ExitStatus::of(err)
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

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;
    use toporun_shared::torchrun::OptionsError;

    #[test]
    fn an_error_is_usage_when_any_error_of_its_chain_says_so() {
        let e = anyhow::Error::new(CannotRun("no job runs here".into()));
        assert_eq!(ExitStatus::of(&e), ExitStatus::Usage);
        // Wrapped in context, as a caller adds where it was doing something.
        let e = Err::<(), _>(OptionsError::usage("--nnodes 0"))
            .context("resolving the options")
            .unwrap_err();
        assert_eq!(ExitStatus::of(&e).code(), 2);
        // Kept as another error's #[source]: downcast_ref sees only the outer error.
        let inner =
            toporun_agent::job::JobError::bad_input("TOPORUN_XID_REPLAY=x", CannotRun("x".into()));
        let e = anyhow::Error::new(std::io::Error::other(inner));
        assert!(e.downcast_ref::<CannotRun>().is_none());
        assert_eq!(ExitStatus::of(&e), ExitStatus::Usage);
        let e = anyhow::Error::new(OptionsError::value("--no-python and -m"));
        assert_eq!(ExitStatus::of(&e), ExitStatus::Failed);
        let e = anyhow::anyhow!("the rendezvous closed");
        assert_eq!(ExitStatus::of(&e).code(), 1);
        // A node the network check refused ends with the peer class, in context too.
        let refused = toporun_agent::job::JobError::NetworkRefused("node 2 is slow".into());
        let e = Err::<(), _>(refused).context("the job").unwrap_err();
        assert_eq!(ExitStatus::of(&e), ExitStatus::Job(82));
    }

    #[test]
    fn every_status_has_its_code() {
        let all = [
            (ExitStatus::Success, 0),
            (ExitStatus::Failed, 1),
            (ExitStatus::Usage, 2),
            (ExitStatus::Unfit, 3),
            (ExitStatus::Job(124), 124),
            (ExitStatus::Clap(0), 0),
        ];
        for (s, code) in all {
            assert_eq!(s.code(), code, "{s:?}");
        }
    }
}
