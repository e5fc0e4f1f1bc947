//! What the agent's end-to-end tests share.

/// The interpreter with real PyTorch: TOPORUN_PYTHON, else the cached virtualenv
/// (scripts/dev/setup_venv.sh).
pub fn python() -> String {
    std::env::var("TOPORUN_PYTHON").unwrap_or_else(|_| {
        format!(
            "{}/.cache/toporun-venv/bin/python",
            std::env::var("HOME").unwrap_or_else(|_| "/root".into())
        )
    })
}
