//! The status endpoint (axum) on a thread and runtime of its own, so it answers (503
//! where due) even when the supervisor is stuck: `/healthz`, `/readyz`, `/metrics`,
//! `/status`, `/stacks` (the ranks' Python frames: file, function, line; served
//! wherever the port is reachable). Read-only; nothing in it comes from the environment.

use super::metrics;
use super::state::JobStatus;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use std::net::{Ipv6Addr, SocketAddr};
use std::time::Duration;

/// The supervisor must have turned within this for `/healthz` to say 200.
const ALIVE_WITHIN: Duration = Duration::from_secs(10);

async fn healthz(State(s): State<JobStatus>) -> impl IntoResponse {
    if s.snapshot().alive(ALIVE_WITHIN) {
        (StatusCode::OK, "ok\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "the supervisor loop has not turned for 10 s\n",
        )
    }
}

async fn readyz(State(s): State<JobStatus>) -> impl IntoResponse {
    let x = s.snapshot();
    if x.ready() {
        (StatusCode::OK, "ready\n".to_string())
    } else if !x.rendezvous_complete {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "waiting for the rendezvous\n".to_string(),
        )
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "{} of {} local ranks running\n",
                x.ranks
                    .iter()
                    .filter(|r| r.state == super::state::RankState::Running)
                    .count(),
                x.nproc
            ),
        )
    }
}

async fn metrics_text(State(s): State<JobStatus>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        metrics::render(&s.snapshot()),
    )
}

async fn status_json(State(s): State<JobStatus>) -> impl IntoResponse {
    axum::Json(s.snapshot())
}

/// Every local rank's Python stack now (frames only: file, function, line), grouped
/// with the odd ones first; `?format=json` for JSON.
async fn stacks(
    State(s): State<JobStatus>,
    axum::extract::RawQuery(q): axum::extract::RawQuery,
) -> impl IntoResponse {
    let json = q.is_some_and(|q| q.split('&').any(|kv| kv == "format=json"));
    let Some(f) = s.stacks() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "no rank has started yet\n".to_string(),
        );
    };
    match tokio::task::spawn_blocking(move || f(json)).await {
        Ok(text) => (StatusCode::OK, text),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
    }
}

/// Serves on every interface at `port` (dual-stack, as the kubelet probes the pod IP);
/// returns once bound, or the reason it could not bind.
pub fn serve(port: u16, status: JobStatus) -> std::io::Result<SocketAddr> {
    crate::own_thread::serve("toporun-status", move |bound| async move {
        let listener = match tokio::net::TcpListener::bind((Ipv6Addr::UNSPECIFIED, port)).await {
            Ok(l) => Ok(l),
            Err(_) => tokio::net::TcpListener::bind(("0.0.0.0", port)).await,
        };
        let listener = match listener.and_then(|l| Ok((l.local_addr()?, l))) {
            Ok((addr, l)) => {
                bound(Ok(addr));
                l
            }
            Err(e) => return bound(Err(e)),
        };
        let app = Router::new()
            .route("/healthz", get(healthz))
            .route("/readyz", get(readyz))
            .route("/metrics", get(metrics_text))
            .route("/status", get(status_json))
            .route("/stacks", get(stacks))
            .with_state(status);
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!("status endpoint stopped: {e}");
        }
    })
}
