//! Starting one rank: its own session (process group), a parent-death signal, its
//! CPUs, its output sinks.

use super::logs::{Console, Sink};
use super::tail::Tail;
use super::vfork_exec::Setup;
use nix::unistd::Pid;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Debug, Clone)]
pub struct RankCmd {
    pub local_rank: u32,
    pub rank: u32,
    pub argv: Vec<String>,
    /// Added to (and overriding) toporun's own environment.
    pub env: BTreeMap<String, String>,
    pub cpus: Option<Vec<u32>>,
    pub error_file: PathBuf,
    pub stdout: Sink,
    pub stderr: Sink,
    /// The last bytes of its stderr, where toporun reads it.
    pub stderr_tail: Tail,
}

impl RankCmd {
    /// Starts the rank (super::vfork_exec). Must run on a thread that lives as long as
    /// the job: PR_SET_PDEATHSIG fires when the starting *thread* exits.
    pub fn spawn(&self, console: &Console) -> std::io::Result<Pid> {
        let out = self.stdout.ends()?;
        let err = self.stderr.ends()?;
        let stdin = std::fs::File::open("/dev/null")?;
        let cpus = match &self.cpus {
            Some(cpus) => {
                let mut set = nix::sched::CpuSet::new();
                for c in cpus {
                    set.set(*c as usize)?;
                }
                Some(set)
            }
            None => None,
        };
        let setup = Setup {
            stdio: [Some(stdin.into()), out.child, err.child],
            cpus,
            nofile: super::open_files::for_ranks(),
        };
        let pid = super::vfork_exec::spawn(&self.argv, &self.env, setup)?;
        self.stdout.forward(out.read, None, console);
        self.stderr
            .forward(err.read, Some(self.stderr_tail.clone()), console);
        Ok(pid)
    }
}
