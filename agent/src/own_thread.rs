//! A server on a thread and tokio runtime of its own (the store, the status endpoint):
//! nothing the launcher's own runtime does can delay it, and nothing it does can delay
//! the launcher. The runtime is made, used and dropped on that thread (a runtime may
//! not be dropped inside the caller's async context).

use std::future::Future;
use std::net::SocketAddr;

/// Reports the bind's outcome back to the caller of `serve`.
pub type Bound = Box<dyn FnOnce(std::io::Result<SocketAddr>) + Send>;

/// Runs `server` on a new thread named `name`; `server` binds, calls its `Bound` with
/// the address (or the error), then serves. Returns once it has bound.
pub fn serve<F, Fut>(name: &str, server: F) -> std::io::Result<SocketAddr>
where
    F: FnOnce(Bound) -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    let (tx, rx) = std::sync::mpsc::channel::<std::io::Result<SocketAddr>>();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => return drop(tx.send(Err(e))),
            };
            let bound: Bound = Box::new(move |r| drop(tx.send(r)));
            rt.block_on(server(bound));
        })?;
    rx.recv()
        .map_err(|_| std::io::Error::other(format!("{name} ended before binding")))?
}
