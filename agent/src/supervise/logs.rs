//! Where a rank's stdout/stderr go: the console as is, a log file, or both with
//! torchrun's `[default0]:` prefix. Lines are copied whole by one thread per pipe
//! into a console queue of fixed size: a burst waits there instead of holding the
//! rank back, and a console that stops draining holds the ranks back (they block on
//! their pipes, as under torchrun) instead of growing toporun's memory. Nothing is
//! dropped.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{mpsc, Arc, Mutex, PoisonError};

use super::tail::Tail;
use toporun_shared::torchrun::line_filters;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sink {
    /// The console, unchanged (torchrun's default).
    Inherit,
    /// Discarded from the console (filtered out) and not redirected.
    Null,
    /// Only to this file (--redirects).
    File(PathBuf),
    /// To the console with a prefix, and to the file if given (--tee, filters); the
    /// lines that match `duplicate` also to its file.
    Prefixed {
        prefix: String,
        file: Option<PathBuf>,
        stderr: bool,
        duplicate: Option<Duplicate>,
    },
    /// stderr to the console byte for byte, through a pipe toporun reads (the rank's
    /// last exception): the default where toporun's own stderr is no terminal.
    Watched,
    /// As `Watched`, through a pseudo-terminal of the terminal's size: where toporun's
    /// stderr is a terminal, the rank still sees one (colours, progress bars drawn in
    /// place) and toporun still reads its exception.
    Terminal,
}

/// How a rank's stderr shown on the console is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StderrRead {
    /// Not at all: inherited, as torchrun (--read-stderr off).
    #[default]
    Off,
    /// Through a pipe (toporun's stderr is no terminal: a pod).
    Pipe,
    /// Through a pseudo-terminal (toporun's stderr is a terminal).
    Terminal,
}

/// A rank's stream as spawned: what the rank writes to (None: toporun's own) and the
/// end toporun reads.
#[derive(Default)]
pub(super) struct Ends {
    pub child: Option<OwnedFd>,
    pub read: Option<File>,
}

/// Which console stream a line goes to; Flush is acknowledged once all before it are
/// written.
enum Line {
    Out(Vec<u8>),
    Err(Vec<u8>),
    Flush(mpsc::Sender<()>),
}

/// The console of one attempt: a queue of whole lines from every rank's pipes,
/// written by one thread (lines of different ranks never interleave), with a byte
/// budget, and the forwarders still copying a pipe. Cloned into each forwarder; the
/// writer thread ends when the last clone and forwarder are gone.
#[derive(Clone)]
pub struct Console {
    tx: mpsc::Sender<Line>,
    budget: Arc<Budget>,
    /// Each forwarder reports on its channel when its pipe closed.
    forwarders: Arc<Mutex<Vec<mpsc::Receiver<()>>>>,
}

impl Console {
    /// Starts the writer thread.
    pub fn start() -> Console {
        let (tx, rx) = mpsc::channel::<Line>();
        let budget = Arc::new(Budget::default());
        let room = budget.clone();
        std::thread::spawn(move || {
            for line in rx {
                let (bytes, to_stderr) = match line {
                    Line::Out(b) => (b, false),
                    Line::Err(b) => (b, true),
                    Line::Flush(ack) => {
                        let _ = std::io::stdout().flush();
                        let _ = ack.send(());
                        continue;
                    }
                };
                // Written or not (a closed console), the line leaves the queue.
                let _ = if to_stderr {
                    std::io::stderr().lock().write_all(&bytes)
                } else {
                    std::io::stdout().lock().write_all(&bytes)
                };
                room.give(bytes.len());
            }
        });
        Console {
            tx,
            budget,
            forwarders: Default::default(),
        }
    }

    /// Waits until every rank's output has reached the console and log files: the
    /// pipes' forwarders finish at EOF, then the queue is flushed. Bounded by `limit`,
    /// in case a detached grandchild keeps a pipe open.
    pub fn drain(&self, limit: std::time::Duration) {
        let deadline = std::time::Instant::now() + limit;
        let left = || deadline.saturating_duration_since(std::time::Instant::now());
        let pending = std::mem::take(
            &mut *self
                .forwarders
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for done in pending {
            let _ = done.recv_timeout(left());
        }
        let (tx, rx) = mpsc::channel();
        // Bounded: a console that does not drain must not hold the exit past the limit.
        if self.tx.send(Line::Flush(tx)).is_ok() {
            let _ = rx.recv_timeout(left());
        }
    }

    /// A new forwarder: the channel it reports its end on.
    fn forwarder(&self) -> mpsc::Sender<()> {
        let (done_tx, done_rx) = mpsc::channel();
        self.forwarders
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(done_rx);
        done_tx
    }

    /// Queues `line` once the budget has room for it.
    fn send(&self, line: Vec<u8>, to_stderr: bool) {
        self.budget.take(line.len());
        let _ = self.tx.send(if to_stderr {
            Line::Err(line)
        } else {
            Line::Out(line)
        });
    }
}

/// Reads up to and including the next newline, or MAX_PIECE bytes, whichever comes
/// first (`whole_lines` false: whatever has come, as a terminal shows it: a progress
/// bar redrawn with `\r` and no newline); 0 at end of file. What was read before an
/// error (a pseudo-terminal ends with EIO) is returned first.
fn read_piece(
    reader: &mut BufReader<File>,
    buf: &mut Vec<u8>,
    whole_lines: bool,
) -> std::io::Result<usize> {
    loop {
        let available = match reader.fill_buf() {
            Ok(a) => a,
            Err(_) if !buf.is_empty() => return Ok(buf.len()),
            Err(e) => return Err(e),
        };
        if available.is_empty() {
            return Ok(buf.len());
        }
        if !whole_lines {
            let take = available.len().min(MAX_PIECE);
            buf.extend_from_slice(&available[..take]);
            reader.consume(take);
            return Ok(buf.len());
        }
        let room = MAX_PIECE - buf.len();
        let window = &available[..available.len().min(room)];
        let (take, whole) = match window.iter().position(|b| *b == b'\n') {
            Some(i) => (i + 1, true),
            None => (window.len(), buf.len() + window.len() == MAX_PIECE),
        };
        buf.extend_from_slice(&window[..take]);
        reader.consume(take);
        if whole {
            return Ok(buf.len());
        }
    }
}

/// Bytes the console queue may hold: a burst this size passes without holding the
/// rank back; beyond it the rank waits for the console.
const CONSOLE_BYTES: usize = 16 << 20;
/// Longest piece of a line copied at once: a rank writing without newlines is
/// forwarded in pieces of this size (each its own console line, the file unchanged).
const MAX_PIECE: usize = 64 << 10;

/// The bytes queued for the console, and a wake-up for forwarders waiting on room.
#[derive(Default)]
struct Budget {
    queued: Mutex<usize>,
    room: std::sync::Condvar,
}

impl Budget {
    /// Waits until `n` more bytes fit (a lone line always fits).
    fn take(&self, n: usize) {
        let mut q = self.queued.lock().unwrap_or_else(PoisonError::into_inner);
        while *q > 0 && *q + n > CONSOLE_BYTES {
            q = self.room.wait(q).unwrap_or_else(PoisonError::into_inner);
        }
        *q += n;
    }

    fn give(&self, n: usize) {
        let mut q = self.queued.lock().unwrap_or_else(PoisonError::into_inner);
        *q = q.saturating_sub(n);
        self.room.notify_all();
    }
}

impl Sink {
    /// The rank's end of this stream (None: toporun's own) and, where toporun reads
    /// it, the pipe's other end.
    pub(super) fn ends(&self) -> std::io::Result<Ends> {
        Ok(match self {
            Sink::Inherit => Ends::default(),
            Sink::Null => Ends {
                child: Some(
                    std::fs::File::options()
                        .write(true)
                        .open("/dev/null")?
                        .into(),
                ),
                read: None,
            },
            Sink::File(p) => Ends {
                child: Some(private_file(p)?.into()),
                read: None,
            },
            Sink::Prefixed { .. } | Sink::Watched => {
                let (read, write) = std::io::pipe()?;
                Ends {
                    child: Some(write.into()),
                    read: Some(File::from(OwnedFd::from(read))),
                }
            }
            // Without a pseudo-terminal (none left, /dev/pts not mounted) the rank's
            // stderr is still read, through a pipe.
            Sink::Terminal => match super::pty::open() {
                Ok((read, write)) => Ends {
                    child: Some(write),
                    read: Some(read),
                },
                Err(_) => Sink::Watched.ends()?,
            },
        })
    }

    /// Copies the pipe to its destinations; a stderr pipe's bytes also go to `tail`.
    pub(super) fn forward(&self, pipe: Option<File>, tail: Option<Tail>, console: &Console) {
        let Some(pipe) = pipe else {
            return;
        };
        // A terminal shows what comes as it comes; elsewhere whole lines keep the
        // ranks' lines apart.
        let whole_lines = *self != Sink::Terminal;
        let (prefix, file, is_err, exact, duplicate) = match self {
            Sink::Prefixed {
                prefix,
                file,
                stderr,
                duplicate,
            } => (
                prefix.clone().into_bytes(),
                file.clone(),
                *stderr,
                false,
                duplicate.clone(),
            ),
            Sink::Watched | Sink::Terminal => (Vec::new(), None, true, true, None),
            _ => return,
        };
        let mut log = file.as_ref().and_then(|p| private_file(p).ok());
        let mut dup = duplicate
            .as_ref()
            .and_then(|d| Some((d.needles.clone(), d.open()?)));
        if let Some(t) = &tail {
            t.feeding();
        }
        let console = console.clone();
        let done_tx = console.forwarder();
        std::thread::spawn(move || {
            let _done = done_tx;
            let mut reader = BufReader::with_capacity(64 * 1024, pipe);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match read_piece(&mut reader, &mut buf, whole_lines) {
                    Ok(0) | Err(_) => {
                        if let Some(t) = &tail {
                            t.close();
                        }
                        break;
                    }
                    Ok(_) => {}
                }
                if let Some(t) = &tail {
                    t.push(&buf);
                }
                if let Some(f) = log.as_mut() {
                    let _ = f.write_all(&buf);
                }
                let mut line = Vec::with_capacity(prefix.len() + buf.len() + 1);
                line.extend_from_slice(&prefix);
                line.extend_from_slice(&buf);
                // A watched stream stays byte for byte what the rank wrote.
                if !exact && !line.ends_with(b"\n") {
                    line.push(b'\n');
                }
                if let Some((needles, f)) = dup.as_mut() {
                    if line_filters::matches(needles, &buf) {
                        // One write per line: the node's ranks share the file.
                        let _ = f.write_all(&line);
                    }
                }
                console.send(line, is_err);
            }
        });
    }
}

/// The lines of a tee'd stream that contain any of `needles` go, prefixed, to `file`
/// too: one file for every rank of the node, each opened to append.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Duplicate {
    pub needles: Vec<String>,
    pub file: PathBuf,
}

impl Duplicate {
    fn open(&self) -> Option<File> {
        std::fs::OpenOptions::new()
            .append(true)
            .open(&self.file)
            .ok()
    }
}

/// torchrun's console prefix: TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE with ${role_name},
/// ${rank}, ${local_rank}; default `[${role_name}${local_rank}]:`.
pub fn line_prefix(template: Option<&str>, role: &str, rank: u32, local_rank: u32) -> String {
    match template {
        Some(t) => t
            .replace("${role_name}", role)
            .replace("${rank}", &rank.to_string())
            .replace("${local_rank}", &local_rank.to_string()),
        None => format!("[{role}{local_rank}]:"),
    }
}

/// The output plan of one rank, from --redirects, --tee and --local-ranks-filter.
pub struct LogPlan<'a> {
    pub redirect_out: bool,
    pub redirect_err: bool,
    pub tee_out: bool,
    pub tee_err: bool,
    pub shown: bool,
    pub dir: &'a std::path::Path,
    pub prefix: String,
    /// How stderr shown as is goes through toporun ([`Sink::Watched`],
    /// [`Sink::Terminal`]).
    pub watch_stderr: StderrRead,
    /// The node's filtered stdout and stderr files, where filters were given.
    pub duplicate: (Option<&'a Duplicate>, Option<&'a Duplicate>),
}

impl LogPlan<'_> {
    /// The sinks for stdout and stderr.
    pub fn sinks(&self) -> (Sink, Sink) {
        let one = |redirect: bool, tee: bool, name: &str, stderr: bool| {
            let file = self.dir.join(name);
            let duplicate = if stderr {
                self.duplicate.1
            } else {
                self.duplicate.0
            };
            if redirect && !tee {
                Sink::File(file)
            } else if tee {
                if self.shown {
                    Sink::Prefixed {
                        prefix: self.prefix.clone(),
                        file: Some(file),
                        stderr,
                        duplicate: duplicate.cloned(),
                    }
                } else {
                    Sink::File(file)
                }
            } else if !self.shown {
                Sink::Null
            } else if self.prefixed_console() {
                Sink::Prefixed {
                    prefix: self.prefix.clone(),
                    file: None,
                    stderr,
                    duplicate: None,
                }
            } else if stderr && self.watch_stderr == StderrRead::Pipe {
                Sink::Watched
            } else if stderr && self.watch_stderr == StderrRead::Terminal {
                Sink::Terminal
            } else {
                Sink::Inherit
            }
        };
        (
            one(self.redirect_out, self.tee_out, "stdout.log", false),
            one(self.redirect_err, self.tee_err, "stderr.log", true),
        )
    }

    fn prefixed_console(&self) -> bool {
        self.tee_out || self.tee_err
    }
}

/// A rank's log: readable by the job's user only (0600), as torchrun's are.
pub fn private_file(path: &std::path::Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A forwarder whose pipe stays open (a grandchild holding it) holds only its own
    /// attempt's drain, for the limit, and no other console's.
    #[test]
    fn each_console_drains_its_own_forwarders() {
        let held = Console::start();
        let (reader, _writer) = std::io::pipe().unwrap();
        let pipe = File::from(std::os::fd::OwnedFd::from(reader));
        Sink::Watched.forward(Some(pipe), None, &held);
        let other = Console::start();
        let t = std::time::Instant::now();
        other.drain(std::time::Duration::from_secs(5));
        assert!(
            t.elapsed() < std::time::Duration::from_secs(1),
            "{:?}",
            t.elapsed()
        );
        let t = std::time::Instant::now();
        held.drain(std::time::Duration::from_millis(300));
        assert!(
            t.elapsed() >= std::time::Duration::from_millis(300),
            "{:?}",
            t.elapsed()
        );
    }

    #[test]
    fn prefix_template() {
        assert_eq!(line_prefix(None, "default", 5, 1), "[default1]:");
        assert_eq!(
            line_prefix(
                Some("[${role_name}-${rank}/${local_rank}] "),
                "trainer",
                5,
                1
            ),
            "[trainer-5/1] "
        );
    }

    #[test]
    fn sinks_follow_torchrun_semantics() {
        let dir = std::path::Path::new("/logs/attempt_0/0");
        let base = LogPlan {
            redirect_out: false,
            redirect_err: false,
            tee_out: false,
            tee_err: false,
            shown: true,
            dir,
            prefix: "[default0]:".into(),
            watch_stderr: StderrRead::Off,
            duplicate: (None, None),
        };
        assert_eq!(base.sinks(), (Sink::Inherit, Sink::Inherit));
        let watched = LogPlan {
            watch_stderr: StderrRead::Pipe,
            prefix: String::new(),
            ..base
        };
        assert_eq!(watched.sinks(), (Sink::Inherit, Sink::Watched));
        let on_terminal = LogPlan {
            watch_stderr: StderrRead::Terminal,
            prefix: String::new(),
            ..watched
        };
        assert_eq!(on_terminal.sinks(), (Sink::Inherit, Sink::Terminal));
        let base = LogPlan {
            watch_stderr: StderrRead::Off,
            prefix: "[default0]:".into(),
            ..watched
        };
        let tee = LogPlan {
            tee_out: true,
            tee_err: true,
            ..base
        };
        assert!(matches!(
            tee.sinks().0,
            Sink::Prefixed { file: Some(_), .. }
        ));
        // Filters apply to the tee'd stream only (torchrun tails the tee'd files).
        let dup = Duplicate {
            needles: vec!["loss".into()],
            file: "/logs/attempt_0/filtered_stdout.log".into(),
        };
        let tee_out = LogPlan {
            tee_err: false,
            duplicate: (Some(&dup), None),
            ..tee
        };
        let (out, err) = tee_out.sinks();
        assert!(matches!(out, Sink::Prefixed { duplicate: Some(d), .. } if d == dup));
        assert!(matches!(
            err,
            Sink::Prefixed {
                file: None,
                duplicate: None,
                ..
            }
        ));
        let red = LogPlan {
            redirect_out: true,
            tee_out: false,
            tee_err: false,
            duplicate: (None, None),
            ..tee_out
        };
        assert_eq!(red.sinks().0, Sink::File(dir.join("stdout.log")));
        let hidden = LogPlan {
            redirect_out: false,
            shown: false,
            ..red
        };
        assert_eq!(hidden.sinks(), (Sink::Null, Sink::Null));
    }
}
