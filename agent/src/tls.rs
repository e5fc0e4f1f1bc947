//! The process's TLS provider, shared by every HTTPS client (etcd, cloud metadata).

/// Installs rustls' ring provider for this process (reqwest is built without one of
/// its own: aws-lc would need cmake and a C toolchain per target).
pub fn install_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
