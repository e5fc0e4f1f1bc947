//! Starting a program as posix_spawn does, in a child that shares toporun's memory
//! until it execs (CLONE_VM | CLONE_VFORK), with the steps a rank needs in between
//! that posix_spawn cannot take: the parent-death signal, its CPUs, its open-files
//! limit. std's `pre_exec` forks instead, copying the page tables of toporun's threads
//! and buffers for every rank only for exec to drop them: with 8 ranks that was a
//! tenth of a no-op job's start (profiled with perf, docs/measurements.md).
//!
//! Between clone and exec the child runs on a stack of its own but in the parent's
//! memory: it only makes system calls on values prepared beforehand (no allocation,
//! no lock), and the parent's thread waits, all signals blocked, until it has exec'd
//! or exited.

use nix::sched::{CloneFlags, CpuSet};
use nix::sys::signal::{SigSet, SigmaskHow};
use nix::unistd::Pid;
use std::collections::BTreeMap;
use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};

/// Room for the child's few calls (glibc's posix_spawn takes 32 KiB plus the argv).
const CHILD_STACK: usize = 64 * 1024;

/// What the child does before it execs.
pub struct Setup {
    /// The child's stdin, stdout, stderr; None keeps toporun's.
    pub stdio: [Option<OwnedFd>; 3],
    pub cpus: Option<CpuSet>,
    /// RLIMIT_NOFILE (soft, hard) to give back.
    pub nofile: Option<(u64, u64)>,
}

/// Everything execve takes, as the child will read it.
struct Exec {
    path: CString,
    _strings: Vec<CString>,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
}

/// Starts `argv` in its own session with toporun's environment plus `env`; returns once
/// the program has been exec'd (an exec that fails is this call's error, its child
/// reaped). Must run on a thread that lives as long as the child: PR_SET_PDEATHSIG
/// fires when the starting *thread* exits.
pub fn spawn(
    argv: &[String],
    env: &BTreeMap<String, String>,
    setup: Setup,
) -> std::io::Result<Pid> {
    let exec = Exec::new(argv, env)?;
    let parent = nix::unistd::getpid().as_raw();
    let failed = AtomicI32::new(0);
    let mut stack = vec![0u8; CHILD_STACK];
    let fds = setup
        .stdio
        .each_ref()
        .map(|f| f.as_ref().map(AsRawFd::as_raw_fd));
    let child = Box::new(|| -> isize {
        // SAFETY: the child only makes system calls on values prepared above.
        let errno = unsafe { before_exec(&exec, fds, parent, &setup) };
        failed.store(errno, Ordering::SeqCst);
        // SAFETY: leaves without running anything of the parent's (atexit, buffers).
        unsafe { libc::_exit(127) }
    });
    // No handler of toporun's may run in the child before it has reset them.
    let mut old = SigSet::empty();
    nix::sys::signal::pthread_sigmask(
        SigmaskHow::SIG_SETMASK,
        Some(&SigSet::all()),
        Some(&mut old),
    )?;
    // SAFETY: CLONE_VFORK suspends this thread until the child execs or exits, so the
    // stack, `exec` and `failed` outlive every use the child makes of them.
    let pid = unsafe {
        nix::sched::clone(
            child,
            &mut stack,
            CloneFlags::CLONE_VM | CloneFlags::CLONE_VFORK,
            Some(libc::SIGCHLD),
        )
    };
    nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None)?;
    let pid = pid?;
    match failed.load(Ordering::SeqCst) {
        0 => Ok(pid),
        errno => {
            let _ = nix::sys::wait::waitpid(pid, None);
            Err(std::io::Error::from_raw_os_error(errno))
        }
    }
}

/// The child's steps up to execve; returns the errno of the one that failed.
///
/// # Safety
/// Only in the child of `spawn`'s clone: async-signal-safe calls, no allocation.
unsafe fn before_exec(exec: &Exec, fds: [Option<i32>; 3], parent: i32, setup: &Setup) -> i32 {
    let errno = || nix::errno::Errno::last_raw();
    for (target, fd) in fds.iter().enumerate() {
        if let Some(fd) = fd {
            if libc::dup2(*fd, target as i32) < 0 {
                return errno();
            }
        }
    }
    if libc::setsid() < 0 || libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) < 0 {
        return errno();
    }
    // toporun died before the prctl: the signal would never come.
    if libc::getppid() != parent {
        libc::raise(libc::SIGKILL);
    }
    if let Some((soft, hard)) = setup.nofile {
        let limit = libc::rlimit {
            rlim_cur: soft,
            rlim_max: hard,
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) < 0 {
            return errno();
        }
    }
    if let Some(cpus) = &setup.cpus {
        if nix::sched::sched_setaffinity(Pid::from_raw(0), cpus).is_err() {
            return errno();
        }
    }
    default_handlers();
    // As std's children: no signal blocked (the parent's thread had them all blocked).
    let none: libc::sigset_t = std::mem::zeroed();
    libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    libc::execve(exec.path.as_ptr(), exec.argv.as_ptr(), exec.envp.as_ptr());
    errno()
}

/// Every signal toporun handles back to its default (the handlers live in the shared
/// memory), and SIGPIPE, which Rust's runtime ignores, too; other ignored signals stay
/// ignored across exec, as with std's Command.
unsafe fn default_handlers() {
    for sig in 1..=libc::SIGRTMAX() {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        let mut now: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, std::ptr::null(), &mut now) < 0 {
            continue;
        }
        if now.sa_sigaction != libc::SIG_DFL
            && (now.sa_sigaction != libc::SIG_IGN || sig == libc::SIGPIPE)
        {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(sig, &dfl, std::ptr::null_mut());
        }
    }
}

impl Exec {
    fn new(argv: &[String], env: &BTreeMap<String, String>) -> std::io::Result<Exec> {
        let prog = argv
            .first()
            .ok_or_else(|| std::io::Error::other("empty command line"))?;
        let mut vars: BTreeMap<OsString, OsString> = std::env::vars_os().collect();
        vars.extend(env.iter().map(|(k, v)| (k.into(), v.into())));
        let path = resolve(prog, vars.get(OsStr::new("PATH")).map(OsString::as_os_str))?;
        let c = |b: &[u8]| CString::new(b).map_err(std::io::Error::other);
        let args: Vec<CString> = argv
            .iter()
            .map(|a| c(a.as_bytes()))
            .collect::<Result<_, _>>()?;
        let envs: Vec<CString> = vars
            .into_iter()
            .map(|(k, v)| {
                let mut kv = k.into_vec();
                kv.push(b'=');
                kv.extend(v.into_vec());
                c(&kv)
            })
            .collect::<Result<_, _>>()?;
        let pointers = |s: &[CString]| {
            let mut p: Vec<*const libc::c_char> = s.iter().map(|c| c.as_ptr()).collect();
            p.push(std::ptr::null());
            p
        };
        let (argv, envp) = (pointers(&args), pointers(&envs));
        Ok(Exec {
            path: c(path.as_os_str().as_bytes())?,
            _strings: args.into_iter().chain(envs).collect(),
            argv,
            envp,
        })
    }
}

/// `prog` as execvp finds it: a name with a slash as given, else the first executable
/// file of that name on `path_var` (the child's PATH).
fn resolve(prog: &str, path_var: Option<&OsStr>) -> std::io::Result<PathBuf> {
    if prog.contains('/') {
        return Ok(PathBuf::from(prog));
    }
    let dirs = path_var.unwrap_or(OsStr::new("/usr/local/bin:/usr/bin:/bin"));
    std::env::split_paths(dirs)
        .map(|d| d.join(prog))
        .find(|p| is_executable(p))
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::wait::{waitpid, WaitStatus};
    use std::io::Read;

    fn setup(stdout: Option<OwnedFd>) -> Setup {
        Setup {
            stdio: [None, stdout, None],
            cpus: None,
            nofile: None,
        }
    }

    fn sh(script: &str) -> Vec<String> {
        vec!["sh".into(), "-c".into(), script.into()]
    }

    /// Runs `argv` with stdout into a pipe; its output and exit code.
    fn output(
        argv: &[String],
        env: &BTreeMap<String, String>,
        s: impl FnOnce(OwnedFd) -> Setup,
    ) -> (String, i32) {
        let (mut r, w) = std::io::pipe().unwrap();
        let pid = spawn(argv, env, s(OwnedFd::from(w))).unwrap();
        let mut out = String::new();
        r.read_to_string(&mut out).unwrap();
        match waitpid(pid, None).unwrap() {
            WaitStatus::Exited(_, code) => (out, code),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_child_gets_its_env_argv_own_session_and_stdout() {
        let env = BTreeMap::from([("TOPORUN_T_VAR".to_string(), "x y".to_string())]);
        let (out, code) = output(
            &sh("echo \"$TOPORUN_T_VAR|$0|$(cut -d' ' -f6 /proc/$$/stat)|$$\"; exit 3"),
            &env,
            |w| setup(Some(w)),
        );
        assert_eq!(code, 3);
        let f: Vec<&str> = out.trim().split('|').collect();
        assert_eq!(&f[..2], ["x y", "sh"], "{out}");
        // setsid: the child leads a session of its own.
        assert_eq!(f[2], f[3], "{out}");
        // The rest of toporun's environment is kept.
        let (out, _) = output(&sh("echo $PATH"), &BTreeMap::new(), |w| setup(Some(w)));
        assert_eq!(out.trim(), std::env::var("PATH").unwrap());
    }

    #[test]
    fn cpus_limit_and_signals_are_set_before_exec() {
        let mut cpus = CpuSet::new();
        cpus.set(0).unwrap();
        let (soft, hard) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
        let lower = soft.min(512);
        let (out, code) = output(
            &sh("grep -E '^(Cpus_allowed_list|SigBlk|SigIgn)' /proc/self/status; ulimit -n"),
            &BTreeMap::new(),
            |w| Setup {
                stdio: [None, Some(w), None],
                cpus: Some(cpus),
                nofile: Some((lower, hard)),
            },
        );
        assert_eq!(code, 0);
        assert!(out.contains("Cpus_allowed_list:\t0\n"), "{out}");
        assert!(out.contains("SigBlk:\t0000000000000000"), "{out}");
        assert!(out.trim_end().ends_with(&lower.to_string()), "{out}");
        // SIGPIPE (bit 13), which the test harness's Rust runtime ignores, is reset.
        let ign = out.lines().find(|l| l.starts_with("SigIgn")).unwrap();
        let mask = u64::from_str_radix(ign.split_whitespace().nth(1).unwrap(), 16).unwrap();
        assert_eq!(mask & (1 << (libc::SIGPIPE - 1)), 0, "{out}");
    }

    #[test]
    fn a_program_not_found_is_the_spawns_error() {
        let e = spawn(
            &["toporun-no-such-program".into()],
            &BTreeMap::new(),
            setup(None),
        )
        .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
        let e = spawn(&["/nonexistent/prog".into()], &BTreeMap::new(), setup(None)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
        // Not executable: execve's own error, the child reaped.
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("data");
        std::fs::write(&f, "x").unwrap();
        let e = spawn(&[f.to_string_lossy().into()], &BTreeMap::new(), setup(None)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied);
        assert!(spawn(&[], &BTreeMap::new(), setup(None)).is_err());
    }

    #[test]
    fn path_lookup_uses_the_childs_path() {
        let dir = tempfile::tempdir().unwrap();
        let prog = dir.path().join("toporun-t-prog");
        std::fs::write(&prog, "#!/bin/sh\necho found\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = format!(
            "{}:{}",
            dir.path().display(),
            std::env::var("PATH").unwrap()
        );
        let env = BTreeMap::from([("PATH".to_string(), path)]);
        let (out, code) = output(&["toporun-t-prog".into()], &env, |w| setup(Some(w)));
        assert_eq!((out.trim(), code), ("found", 0));
    }
}
