//! PyTorch's c10d TCPStore: wire codec and the store's state machine, without I/O.

pub mod codec;
pub mod state;

pub use codec::{decode_request, CodecError, Request};
pub use state::{ConnId, StoreState};
