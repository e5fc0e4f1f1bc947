//! Where the rendezvous state lives: a TCPStore hosted by one node (static, c10d) or
//! etcd (no node is special), behind one [`Backend`] trait.

mod api;
mod etcd;
pub mod etcd_client;
mod etcd_wire;
mod kv;
mod store;

pub use api::{Backend, Beat, KvError};
pub use etcd::EtcdKv;
pub use kv::Kv;
pub use store::StoreKv;
