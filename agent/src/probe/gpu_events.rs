//! Xid critical errors on the node's GPUs, watched for the whole job: NVML's event
//! set on a thread of its own, or a file of JSON lines toporun follows instead
//! (`TOPORUN_XID_REPLAY`: tests, and drills of a podFailurePolicy). Whatever the
//! source, the job sees an [`XidSource`] and keeps every event in an [`XidLog`].

use crate::clock::now_secs;
use crate::probe::nvml_session;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::event::EventSet;
use nvml_wrapper::Nvml;
use std::io::BufRead;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;
use toporun_shared::root_cause::xid::{info, Verdict, XidEvent};

/// Where Xid events come from.
pub trait XidSource: Send {
    /// Waits up to `timeout` for the next event; an error when the source is gone.
    fn next(&mut self, timeout: Duration) -> Result<Option<XidEvent>, XidSourceError>;
}

/// Why Xid events cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum XidSourceError {
    #[error(transparent)]
    Nvml(#[from] NvmlError),
    // The cause is in the message, not a `#[source]`: printed as a chain it would
    // appear twice.
    #[error("GPU {gpu}: {cause}")]
    Register { gpu: u32, cause: NvmlError },
    /// The watch never started (NVML or a GPU's registration refused).
    #[error("{0}")]
    NotWatched(Box<XidSourceError>),
    #[error("the NVML event thread ended")]
    ThreadEnded,
    #[error("{}: {cause}", .path.display())]
    Replay {
        path: std::path::PathBuf,
        cause: std::io::Error,
    },
    #[error("not an Xid event ({cause}): {line}")]
    NotAnEvent {
        line: String,
        cause: serde_json::Error,
    },
}

/// NVML's critical-error events of every GPU, read on a thread of its own.
pub struct NvmlXids {
    rx: mpsc::Receiver<Result<XidEvent, XidSourceError>>,
    stop: Arc<AtomicBool>,
}

impl NvmlXids {
    /// Registers every GPU on the watch's own thread, so that the ranks need not
    /// wait for it (a few ms a GPU); a failure there is the source's first answer.
    pub fn start() -> NvmlXids {
        let (tx, rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let done = stop.clone();
        std::thread::spawn(move || {
            let set = match nvml_session::nvml()
                .map_err(XidSourceError::from)
                .and_then(register)
            {
                Ok(s) => s,
                Err(e) => {
                    return tx
                        .send(Err(XidSourceError::NotWatched(Box::new(e))))
                        .unwrap_or(())
                }
            };
            while !done.load(Ordering::Relaxed) {
                match set.wait(500) {
                    Ok(data) => {
                        let Some(XidError::Value(xid)) = data.event_data else {
                            continue;
                        };
                        if tx.send(Ok(xid_event(&data.device, xid))).is_err() {
                            return;
                        }
                    }
                    Err(NvmlError::Timeout) => {}
                    Err(_) => std::thread::sleep(Duration::from_millis(500)),
                }
            }
        });
        NvmlXids { rx, stop }
    }
}

fn xid_event(device: &nvml_wrapper::Device, xid: u64) -> XidEvent {
    XidEvent {
        gpu: device.index().unwrap_or(u32::MAX),
        uuid: device.uuid().unwrap_or_default(),
        pci_bus_id: device.pci_info().map(|p| p.bus_id).unwrap_or_default(),
        xid,
        at: now_secs(),
    }
}

fn register(nvml: &'static Nvml) -> Result<EventSet<'static>, XidSourceError> {
    let mut set = nvml.create_event_set()?;
    let count = nvml.device_count()?;
    for i in 0..count {
        let dev = nvml.device_by_index(i)?;
        set = dev
            .register_events(EventTypes::CRITICAL_XID_ERROR, set)
            .map_err(|e| XidSourceError::Register {
                gpu: i,
                cause: e.error,
            })?;
    }
    Ok(set)
}

impl Drop for NvmlXids {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl XidSource for NvmlXids {
    fn next(&mut self, timeout: Duration) -> Result<Option<XidEvent>, XidSourceError> {
        match self.rx.recv_timeout(timeout) {
            Ok(e) => e.map(Some),
            Err(mpsc::RecvTimeoutError::Timeout) => Ok(None),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(XidSourceError::ThreadEnded),
        }
    }
}

/// Events from a file of JSON lines (one [`XidEvent`] each), followed as it grows.
pub struct ReplayXids {
    path: std::path::PathBuf,
    reader: std::io::BufReader<std::fs::File>,
    partial: String,
}

impl ReplayXids {
    pub fn open(path: &std::path::Path) -> Result<ReplayXids, XidSourceError> {
        let f = std::fs::File::open(path).map_err(|cause| XidSourceError::Replay {
            path: path.to_path_buf(),
            cause,
        })?;
        Ok(ReplayXids {
            path: path.to_path_buf(),
            reader: std::io::BufReader::new(f),
            partial: String::new(),
        })
    }
}

impl XidSource for ReplayXids {
    fn next(&mut self, timeout: Duration) -> Result<Option<XidEvent>, XidSourceError> {
        loop {
            match self.reader.read_line(&mut self.partial) {
                Ok(0) => {
                    std::thread::sleep(timeout);
                    return Ok(None);
                }
                Ok(_) if !self.partial.ends_with('\n') => continue,
                Ok(_) => {
                    let line = std::mem::take(&mut self.partial);
                    if line.trim().is_empty() {
                        continue;
                    }
                    return serde_json::from_str(&line).map(Some).map_err(|cause| {
                        XidSourceError::NotAnEvent {
                            line: line.trim().to_string(),
                            cause,
                        }
                    });
                }
                Err(cause) => {
                    return Err(XidSourceError::Replay {
                        path: self.path.clone(),
                        cause,
                    })
                }
            }
        }
    }
}

/// Every Xid event of the job so far, kept by a thread that reads the source.
pub struct XidLog {
    events: Arc<Mutex<Vec<XidEvent>>>,
    done: Arc<AtomicBool>,
}

impl XidLog {
    /// Reads `source` until dropped, saying each event as it comes.
    pub fn watch(mut source: Box<dyn XidSource>) -> XidLog {
        let events: Arc<Mutex<Vec<XidEvent>>> = Default::default();
        let done = Arc::new(AtomicBool::new(false));
        let (keep, stop) = (events.clone(), done.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match source.next(Duration::from_millis(500)) {
                    Ok(Some(e)) => {
                        let i = info(e.xid);
                        let whose = match i.verdict {
                            Verdict::Hardware => "a GPU or node fault",
                            Verdict::Code => "the application's own fault",
                            Verdict::Unknown => "not in toporun's table",
                        };
                        crate::console::say!(
                            "toporun: GPU {} ({}, PCI {}) reported Xid {} ({}): {whose}",
                            e.gpu,
                            e.uuid,
                            e.pci_bus_id,
                            e.xid,
                            i.meaning
                        );
                        if let Ok(mut v) = keep.lock() {
                            v.push(e);
                        }
                    }
                    Ok(None) => {}
                    Err(XidSourceError::NotWatched(e)) => {
                        crate::console::say!(
                            "toporun: note: GPU faults (Xid) are not watched: {e}"
                        );
                        return;
                    }
                    Err(e) => {
                        crate::console::say_warning!("GPU faults are no longer watched: {e}");
                        return;
                    }
                }
            }
        });
        XidLog { events, done }
    }

    pub fn events(&self) -> Vec<XidEvent> {
        self.events.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

impl Drop for XidLog {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// The watch starts at once, without waiting for NVML; without a driver (this
    /// machine) its first answer says it never started, on a GPU host it listens.
    #[test]
    fn the_watch_starts_at_once_and_says_when_it_never_did() {
        let started = std::time::Instant::now();
        let mut xids = NvmlXids::start();
        // Registering with NVML takes seconds on a GPU host; starting the thread
        // takes well under a millisecond (a 100 ms bound failed once when CI shared
        // the cores): 1 s tells the two apart.
        assert!(started.elapsed() < Duration::from_secs(1));
        let first = xids.next(Duration::from_secs(2));
        match (nvml_session::nvml(), first) {
            (Err(_), Err(XidSourceError::NotWatched(e))) => {
                assert!(matches!(*e, XidSourceError::Nvml(_)), "{e}")
            }
            (Ok(_), Ok(None)) => {}
            (nvml, first) => panic!("NVML {:?}, first answer {first:?}", nvml.is_ok()),
        }
    }

    /// A source a test feeds.
    struct Fed(mpsc::Receiver<XidEvent>);

    impl XidSource for Fed {
        fn next(&mut self, timeout: Duration) -> Result<Option<XidEvent>, XidSourceError> {
            Ok(self.0.recv_timeout(timeout).ok())
        }
    }

    fn event(xid: u64) -> XidEvent {
        XidEvent {
            gpu: 1,
            uuid: "GPU-1".into(),
            pci_bus_id: "00000000:19:00.0".into(),
            xid,
            at: 1.0,
        }
    }

    fn wait_for(log: &XidLog, n: usize) -> Vec<XidEvent> {
        let start = std::time::Instant::now();
        while log.events().len() < n && start.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        log.events()
    }

    #[test]
    fn a_fed_source_reaches_the_log() {
        let (tx, rx) = mpsc::channel();
        let log = XidLog::watch(Box::new(Fed(rx)));
        tx.send(event(79)).unwrap();
        tx.send(event(13)).unwrap();
        let got = wait_for(&log, 2);
        assert_eq!(got.iter().map(|e| e.xid).collect::<Vec<_>>(), [79, 13]);
    }

    #[test]
    fn a_replay_file_is_followed_as_it_grows() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("xids.jsonl");
        let mut f = std::fs::File::create(&path).unwrap();
        let log = XidLog::watch(Box::new(ReplayXids::open(&path).unwrap()));
        writeln!(f, "{}", serde_json::to_string(&event(48)).unwrap()).unwrap();
        assert_eq!(wait_for(&log, 1)[0].xid, 48);
        writeln!(f, "{}", serde_json::to_string(&event(79)).unwrap()).unwrap();
        assert_eq!(wait_for(&log, 2)[1].xid, 79);
    }
}
