//! `--preflight-measure` runs the measurement in a child process (`toporun preflight
//! --measure`): the launcher never holds a CUDA context the ranks could trip on, and a
//! driver that hangs in cuInit (a GPU fallen off the bus) is given up on after a
//! deadline, with a message, instead of wedging the launch.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use toporun_shared::facts::LinkBandwidth;

/// The whole measurement, CUDA start included, takes well under 2 s on 8 GPUs; the
/// child gives up by itself at this deadline, the launcher stops it 5 s later.
pub const DEADLINE: Duration = Duration::from_secs(30);
const BACKSTOP: Duration = Duration::from_secs(5);

fn failed(why: String) -> LinkBandwidth {
    LinkBandwidth {
        error: Some(why),
        ..Default::default()
    }
}

pub fn measure(deadline: Duration) -> LinkBandwidth {
    match std::env::current_exe() {
        Ok(exe) => measure_with(&exe, deadline + BACKSTOP),
        Err(e) => failed(format!(
            "cannot find toporun's own binary to measure with: {e}"
        )),
    }
}

fn measure_with(exe: &std::path::Path, deadline: Duration) -> LinkBandwidth {
    let mut child = match Command::new(exe)
        .args([
            "preflight",
            "--measure",
            "--no-metadata",
            "--format",
            "json",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return failed(format!("cannot start the measurement: {e}")),
    };
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let reader = drain(Box::new(child.stdout.take().expect("piped")));
    let errors = drain(Box::new(child.stderr.take().expect("piped")));
    let t0 = Instant::now();
    let mut said = false;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if t0.elapsed() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return failed(format!("the measurement did not finish in {:.1} s and was stopped: the CUDA driver hangs (a GPU fallen off the bus? nvidia-smi -q, dmesg for Xid 79)", deadline.as_secs_f64()));
            }
            Ok(None) => {
                if !said && t0.elapsed() >= Duration::from_secs(5) {
                    crate::console::say!("toporun: --preflight-measure: still measuring GPU links after 5 s (gives up at {} s)", deadline.as_secs());
                    said = true;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return failed(format!("waiting for the measurement: {e}")),
        }
    }
    let text = reader.join().unwrap_or_default();
    let why = errors.join().unwrap_or_default();
    serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| serde_json::from_value(v["bandwidth"].clone()).ok())
        .unwrap_or_else(|| {
            let last = why
                .lines()
                .last()
                .unwrap_or("")
                .trim_start_matches("toporun: ");
            failed(format!(
                "the measurement printed no result{}",
                if last.is_empty() {
                    String::new()
                } else {
                    format!(": {last}")
                }
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn script(dir: &std::path::Path, body: &str) -> std::path::PathBuf {
        let p = dir.join("fake-toporun");
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    /// `measure_with` on a script just written: another test thread that forks
    /// while the script is open for writing holds that fd until its child execs,
    /// and exec then fails with ETXTBSY; tried again until that fd is gone.
    fn measure_script(exe: &std::path::Path, deadline: Duration) -> LinkBandwidth {
        for _ in 0..50 {
            let m = measure_with(exe, deadline);
            if !m
                .error
                .as_deref()
                .is_some_and(|e| e.contains("Text file busy"))
            {
                return m;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("{} stayed busy", exe.display())
    }

    #[test]
    fn a_hanging_measurement_is_stopped_at_the_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let t0 = Instant::now();
        let m = measure_script(
            &script(dir.path(), "exec sleep 30"),
            Duration::from_millis(300),
        );
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        let error = m.error.unwrap();
        assert!(error.contains("did not finish in 0.3 s"), "{error}");
    }

    #[test]
    fn the_childs_json_is_the_measurement_and_garbage_is_said() {
        let dir = tempfile::tempdir().unwrap();
        let json = r#"{"ok": true, "findings": [], "bandwidth": {"buffer_bytes": 64, "host": [{"gpu": 0, "h2d_gbps": 55.0, "d2h_gbps": 54.0}]}}"#;
        let m = measure_script(&script(dir.path(), &format!("echo '{json}'")), DEADLINE);
        assert_eq!(m.error, None);
        assert_eq!(m.host[0].d2h_gbps, 54.0);
        let m = measure_script(
            &script(
                dir.path(),
                "echo not json; echo 'toporun: error: cuInit hangs' >&2; exit 2",
            ),
            DEADLINE,
        );
        assert_eq!(
            m.error.unwrap(),
            "the measurement printed no result: error: cuInit hangs"
        );
    }
}
