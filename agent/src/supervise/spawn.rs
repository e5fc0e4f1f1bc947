//! Starting one rank: its own session (process group), a parent-death signal, its
//! CPUs, its output sinks.

use super::logs::{Console, Sink};
use super::tail::Tail;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

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
    /// Forks and execs the rank. Must run on a thread that lives as long as the job:
    /// PR_SET_PDEATHSIG fires when the forking *thread* exits.
    pub fn spawn(&self, console: &Console) -> std::io::Result<Pid> {
        let (prog, args) = self
            .argv
            .split_first()
            .ok_or_else(|| std::io::Error::other("empty command line"))?;
        let mut cmd = Command::new(prog);
        cmd.args(args).envs(&self.env).stdin(Stdio::null());
        let (out, out_pipe) = self.stdout.stdio()?;
        let (err, err_pipe) = self.stderr.stdio()?;
        cmd.stdout(out).stderr(err);
        let parent = nix::unistd::getpid();
        let cpus = self.cpus.clone();
        let nofile = super::open_files::for_ranks();
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                nix::unistd::setsid()?;
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
                // toporun died between fork and prctl: the signal would never come.
                if nix::unistd::getppid() != parent {
                    nix::sys::signal::raise(Signal::SIGKILL)?;
                }
                if let Some((soft, hard)) = nofile {
                    nix::sys::resource::setrlimit(
                        nix::sys::resource::Resource::RLIMIT_NOFILE,
                        soft,
                        hard,
                    )?;
                }
                if let Some(cpus) = &cpus {
                    let mut set = nix::sched::CpuSet::new();
                    for c in cpus {
                        set.set(*c as usize)?;
                    }
                    nix::sched::sched_setaffinity(Pid::from_raw(0), &set)?;
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn()?;
        self.stdout.forward(
            child
                .stdout
                .take()
                .map(|p| std::fs::File::from(std::os::fd::OwnedFd::from(p))),
            out_pipe,
            None,
            console,
        );
        self.stderr.forward(
            child
                .stderr
                .take()
                .map(|p| std::fs::File::from(std::os::fd::OwnedFd::from(p))),
            err_pipe,
            Some(self.stderr_tail.clone()),
            console,
        );
        Ok(Pid::from_raw(child.id() as i32))
    }
}
