//! What can end a job before its ranks decide it, with the data a reader needs: bad
//! input (exit 2) or a failure of the machinery around the ranks (exit 1). The exit
//! code follows from the variant (`exit_code`), nowhere else.

use std::path::PathBuf;
use toporun_shared::root_cause::exit_codes;
use toporun_shared::torchrun::OptionsError;

#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// The options or environment cannot describe a job: exit 2 where argparse would
    /// refuse them, else 1 (torchrun's ValueError), as the error says.
    #[error(transparent)]
    Options(#[from] OptionsError),
    /// An option or variable names something toporun cannot use (exit 2): which,
    /// and the error that said why.
    #[error("{what}")]
    BadInput {
        what: String,
        #[source]
        source: BoxedError,
    },
    /// The store's port is taken or cannot be bound.
    #[error("{}", bind_text(*.port, .option, .holder.as_deref(), .source))]
    Bind {
        port: u16,
        /// The option that chose the port (`--master-port`, `--rdzv-endpoint`).
        option: &'static str,
        /// Who holds it, where /proc tells ("pid 12 (python3, LISTEN)").
        holder: Option<String>,
        source: std::io::Error,
    },
    /// A file or directory the job needs cannot be made.
    #[error("{what} {}: {source}", .path.display())]
    Path {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// The rendezvous, the store or the supervision failed: what toporun was doing,
    /// and the error that stopped it (its own sources kept: `{:#}` prints the chain).
    #[error("{doing}")]
    Step {
        doing: String,
        #[source]
        source: BoxedError,
    },
    /// A failure with no underlying error, whose message says what was done and
    /// what to do.
    #[error("{0}")]
    Failed(String),
    /// `--network-check gate` refused a node (exit: the peer class's code, 82).
    #[error("{0}")]
    NetworkRefused(String),
}

fn bind_text(port: u16, option: &str, holder: Option<&str>, e: &std::io::Error) -> String {
    if e.kind() == std::io::ErrorKind::AddrInUse {
        let who = holder.map_or(String::new(), |w| format!(", held by {w}"));
        format!("port {port} is already in use on this node{who} (another job, or a torchrun left behind); choose another {option} or use --standalone for a free port")
    } else {
        format!("cannot listen on port {port}: {e}")
    }
}

/// Any error a step can fail with, kept with its own chain of sources.
pub type BoxedError = Box<dyn std::error::Error + Send + Sync + 'static>;

impl JobError {
    /// Bad input: the option or variable, and the error that said why.
    pub fn bad_input(what: impl std::fmt::Display, source: impl Into<BoxedError>) -> JobError {
        JobError::BadInput {
            what: what.to_string(),
            source: source.into(),
        }
    }

    /// A failure with what it was doing and the error that stopped it.
    pub fn failed(doing: impl std::fmt::Display, source: impl Into<BoxedError>) -> JobError {
        JobError::Step {
            doing: doing.to_string(),
            source: source.into(),
        }
    }

    pub fn exit_code(&self) -> u8 {
        match self {
            JobError::Options(e) => e.exit_code(),
            JobError::BadInput { .. } => exit_codes::USAGE,
            JobError::Bind { .. }
            | JobError::Path { .. }
            | JobError::Step { .. }
            | JobError::Failed(_) => exit_codes::FAILURE,
            JobError::NetworkRefused(_) => exit_codes::PEER.code,
        }
    }
}

/// An error with what to check after it: said as "{error}. {advice}", the error's
/// own sources kept (it is not repeated in the chain).
#[derive(Debug)]
pub struct WithAdvice<E> {
    pub error: E,
    pub advice: String,
}

impl<E: std::fmt::Display> std::fmt::Display for WithAdvice<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}. {}", self.error, self.advice)
    }
}

impl<E: std::error::Error> std::error::Error for WithAdvice<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.source()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_port_names_its_holder_and_the_option() {
        let e = JobError::Bind {
            port: 29500,
            option: "--master-port",
            holder: Some("pid 7 (python3, LISTEN)".into()),
            source: std::io::ErrorKind::AddrInUse.into(),
        };
        let text = e.to_string();
        assert!(
            text.contains("port 29500 is already in use on this node, held by pid 7"),
            "{text}"
        );
        assert!(text.contains("choose another --master-port"), "{text}");
        assert_eq!(e.exit_code(), 1);
    }

    /// What `{:#}` of anyhow prints: each error of the chain, joined by ": ".
    fn chain(e: &dyn std::error::Error) -> String {
        let mut text = e.to_string();
        let mut next = e.source();
        while let Some(s) = next {
            text.push_str(&format!(": {s}"));
            next = s.source();
        }
        text
    }

    #[test]
    fn a_failed_step_keeps_the_source_of_its_cause() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let store = crate::store::StoreError::Connect {
            addr: "trainer-0:29400".into(),
            waited: std::time::Duration::from_secs(5),
            source: refused,
        };
        let e = JobError::failed("connecting to the rendezvous store", store);
        let text = chain(&e);
        assert!(
            text.starts_with("connecting to the rendezvous store: could not connect to the store at trainer-0:29400 within 5.0s: "),
            "{text}"
        );
        assert!(text.to_lowercase().contains("refused"), "{text}");
        assert_eq!(e.exit_code(), 1);
    }

    #[test]
    fn advice_follows_the_error_and_the_errors_own_sources_stay_in_the_chain() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let store = crate::store::StoreError::Connect {
            addr: "etcd-0:2379".into(),
            waited: std::time::Duration::from_secs(3),
            source: refused,
        };
        let advised = WithAdvice {
            error: store,
            advice: "Check that the port is open".into(),
        };
        let text = chain(&JobError::failed("could not reach etcd", advised));
        let (head, tail) = text.split_once(". Check that the port is open").unwrap();
        assert!(
            head.starts_with("could not reach etcd: could not connect to the store at etcd-0:2379"),
            "{text}"
        );
        assert!(
            tail.to_lowercase().contains("refused"),
            "the source after the advice: {text}"
        );
        assert_eq!(text.matches("could not connect").count(), 1, "{text}");
    }

    #[test]
    fn usage_exits_2_and_the_rest_1() {
        let usage = JobError::from(OptionsError::usage("--nnodes 0:1"));
        assert_eq!(
            (usage.exit_code(), usage.to_string()),
            (2, "--nnodes 0:1".into())
        );
        assert_eq!(JobError::from(OptionsError::value("x")).exit_code(), 1);
        let bad = JobError::bad_input(
            "--rdzv-endpoint",
            crate::rendezvous::etcd_client::EtcdError::NoEndpoints,
        );
        assert_eq!(bad.exit_code(), 2);
        assert_eq!(
            chain(&bad),
            "--rdzv-endpoint: no etcd endpoint: --rdzv-endpoint names none"
        );
        // An error whose message carries its cause says it once.
        let missing = std::path::Path::new("/nonexistent/xids.jsonl");
        let e = crate::probe::gpu_events::ReplayXids::open(missing)
            .err()
            .unwrap();
        let text = chain(&JobError::bad_input("TOPORUN_XID_REPLAY=x", e));
        assert_eq!(text.matches("No such file").count(), 1, "{text}");
        let path = JobError::Path {
            what: "--log-dir",
            path: "/ro/logs".into(),
            source: std::io::ErrorKind::PermissionDenied.into(),
        };
        assert_eq!(path.exit_code(), 1);
        assert!(
            path.to_string().starts_with("--log-dir /ro/logs: "),
            "{path}"
        );
    }
}
