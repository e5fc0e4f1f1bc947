//! Signals toporun handles, registered at start-up so none is missed, and SIGCHLD.

use nix::sys::signal::Signal;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    Child,
    Signal(Signal),
}

pub struct Events {
    rx: mpsc::UnboundedReceiver<Event>,
}

impl Events {
    /// Installs handlers for `handled` and SIGCHLD now; call first thing in main.
    pub fn install(handled: &[Signal]) -> std::io::Result<Events> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut kinds: Vec<(SignalKind, Event)> = handled
            .iter()
            .map(|s| (SignalKind::from_raw(*s as i32), Event::Signal(*s)))
            .collect();
        kinds.push((SignalKind::child(), Event::Child));
        for (kind, ev) in kinds {
            let mut stream = signal(kind)?;
            let tx = tx.clone();
            tokio::spawn(async move {
                while stream.recv().await.is_some() {
                    if tx.send(ev).is_err() {
                        break;
                    }
                }
            });
        }
        Ok(Events { rx })
    }

    pub async fn next(&mut self) -> Event {
        self.rx.recv().await.unwrap_or(Event::Child)
    }

    /// Waits for a child event, dropping handled signals (used while stopping).
    pub async fn next_child(&mut self) {
        while let Some(ev) = self.rx.recv().await {
            if ev == Event::Child {
                return;
            }
        }
    }

    /// A handled signal that already arrived, if any (checked between phases).
    pub fn pending_signal(&mut self) -> Option<Signal> {
        while let Ok(ev) = self.rx.try_recv() {
            if let Event::Signal(s) = ev {
                return Some(s);
            }
        }
        None
    }
}
