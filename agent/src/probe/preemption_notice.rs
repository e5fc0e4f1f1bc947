//! The cloud's early word that this instance goes away, polled from the instance
//! metadata service (`--watch-preemption`): AWS's spot `instance-action` through
//! IMDSv2 (two minutes ahead), GCP's `instance/preempted`, Azure's Scheduled Events
//! of type `Preempt`. Each poll is bounded (one second per request) and cheap.

use super::cloud_metadata::Endpoints;
use std::time::Duration;

/// How often the services are asked: a notice comes 30 s (GCP, Azure) to 2 min (AWS)
/// ahead.
pub const EVERY: Duration = Duration::from_secs(2);
/// One request's bound.
const ASK: Duration = Duration::from_secs(1);
/// Longest answer read.
const MAX_ANSWER: usize = 64 << 10;

/// AWS `spot/instance-action`: `{"action": "terminate", "time": "2026-11-24T14:40:00Z"}`.
pub fn aws_notice(body: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    let action = v.get("action")?.as_str()?;
    let time = v.get("time").and_then(|t| t.as_str()).unwrap_or("soon");
    Some(format!(
        "the AWS spot interruption notice ({action} at {time})"
    ))
}

/// GCP `instance/preempted`: `TRUE` once the instance is being preempted.
pub fn gcp_notice(body: &str) -> Option<String> {
    (body.trim() == "TRUE").then(|| "GCP's preemption notice (instance/preempted: TRUE)".into())
}

/// Azure Scheduled Events: an event of type `Preempt`, with its NotBefore time.
pub fn azure_notice(body: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    let e = v
        .get("Events")?
        .as_array()?
        .iter()
        .find(|e| e.get("EventType").and_then(|t| t.as_str()) == Some("Preempt"))?;
    let at = e
        .get("NotBefore")
        .and_then(|t| t.as_str())
        .unwrap_or("soon");
    Some(format!("Azure's Scheduled Event Preempt (not before {at})"))
}

async fn body(req: reqwest::RequestBuilder) -> Option<String> {
    let resp = req.send().await.ok()?;
    if !resp.status().is_success() {
        return None;
    }
    let bytes = resp.bytes().await.ok()?;
    (bytes.len() <= MAX_ANSWER).then(|| String::from_utf8_lossy(&bytes).into_owned())
}

/// One look at every service configured; the notice, if one was given.
async fn look(http: &reqwest::Client, at: &Endpoints) -> Option<String> {
    if let Some(base) = &at.aws {
        let token = body(
            http.put(format!("{base}/latest/api/token"))
                .header("X-aws-ec2-metadata-token-ttl-seconds", "60"),
        )
        .await;
        if let Some(token) = token.filter(|t| !t.trim().is_empty() && t.len() <= 128) {
            let url = format!("{base}/latest/meta-data/spot/instance-action");
            let req = http
                .get(url)
                .header("X-aws-ec2-metadata-token", token.trim());
            if let Some(n) = body(req).await.as_deref().and_then(aws_notice) {
                return Some(n);
            }
        }
    }
    if let Some(base) = &at.gcp {
        let url = format!("{base}/computeMetadata/v1/instance/preempted");
        let req = http.get(url).header("Metadata-Flavor", "Google");
        if let Some(n) = body(req).await.as_deref().and_then(gcp_notice) {
            return Some(n);
        }
    }
    let base = at.azure.as_ref()?;
    let url = format!("{base}/metadata/scheduledevents?api-version=2020-07-01");
    let req = http.get(url).header("Metadata", "true");
    body(req).await.as_deref().and_then(azure_notice)
}

/// Resolves with the first notice; never, off-cloud or where no service answers.
pub async fn watch(at: Endpoints) -> String {
    crate::tls::install_provider();
    // Plain HTTP to link-local services: no root certificates to load.
    let Ok(http) = reqwest::Client::builder()
        .no_proxy()
        .tls_certs_only([])
        .timeout(ASK)
        .connect_timeout(ASK)
        .build()
    else {
        return std::future::pending().await;
    };
    loop {
        if let Some(n) = look(&http, &at).await {
            return n;
        }
        tokio::time::sleep(EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_clouds_notice_and_no_notice() {
        let aws = r#"{"action": "terminate", "time": "2026-11-24T14:40:00Z"}"#;
        assert_eq!(
            aws_notice(aws).unwrap(),
            "the AWS spot interruption notice (terminate at 2026-11-24T14:40:00Z)"
        );
        assert_eq!(aws_notice("<html>not found</html>"), None);
        assert!(gcp_notice("TRUE\n").is_some());
        assert_eq!(gcp_notice("FALSE"), None);
        let azure = r#"{"DocumentIncarnation": 2, "Events": [{"EventId": "x", "EventType": "Preempt", "NotBefore": "Mon, 24 Nov 2026 14:40:00 GMT"}]}"#;
        assert!(azure_notice(azure)
            .unwrap()
            .contains("not before Mon, 24 Nov 2026"));
        assert_eq!(
            azure_notice(r#"{"Events": [{"EventType": "Reboot"}]}"#),
            None
        );
    }
}
