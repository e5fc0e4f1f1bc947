//! The TCPStore-compatible store: an async server real PyTorch workers connect to, and
//! a client for toporun's own rendezvous.

pub mod client;
pub mod server;

pub use client::{StoreClient, StoreError};
pub use server::{listen_all, Reach, StoreServer};
