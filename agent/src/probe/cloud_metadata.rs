//! The instance type from the cloud's metadata service: AWS IMDSv2 (a token, then the
//! instance type), GCP (`Metadata-Flavor: Google`) and Azure IMDS (`Metadata: true`),
//! asked at once and given BUDGET in all. Off-cloud nothing answers (or the address
//! is unreachable) and the result is None, without a finding.

use std::time::{Duration, Instant};
use toporun_shared::facts::CloudInstance;
use toporun_shared::toporun_vars::ToporunVar;

/// All three services together get this long; a slow one is abandoned.
pub const BUDGET: Duration = Duration::from_millis(300);
/// The link-local address every one of them serves on.
const LINK_LOCAL: &str = "169.254.169.254";
/// Longest answer read: an instance type is a few dozen bytes.
const MAX_ANSWER: usize = 256;

/// Where each service is asked, from the environment the SDKs read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoints {
    /// AWS_EC2_METADATA_SERVICE_ENDPOINT (a URL); None if AWS_EC2_METADATA_DISABLED.
    pub aws: Option<String>,
    /// http://GCE_METADATA_HOST (host[:port]).
    pub gcp: Option<String>,
    /// TOPORUN_AZURE_METADATA_ENDPOINT (a URL; Azure's SDKs have no such variable).
    pub azure: Option<String>,
}

impl Endpoints {
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Endpoints {
        let base = |v: Option<String>| {
            v.filter(|s| !s.trim().is_empty())
                .map(|s| s.trim().trim_end_matches('/').to_string())
                .unwrap_or_else(|| format!("http://{LINK_LOCAL}"))
        };
        let aws_off =
            get("AWS_EC2_METADATA_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
        Endpoints {
            aws: (!aws_off).then(|| base(get("AWS_EC2_METADATA_SERVICE_ENDPOINT"))),
            gcp: Some(base(
                get("GCE_METADATA_HOST").map(|h| format!("http://{}", h.trim())),
            )),
            azure: Some(base(get(ToporunVar::AzureMetadataEndpoint.name()))),
        }
    }
}

/// Asks every service at once; the first plausible answer within BUDGET wins.
pub fn instance(endpoints: &Endpoints) -> Option<CloudInstance> {
    crate::tls::install_provider();
    let t0 = Instant::now();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()?;
    rt.block_on(async {
        // Plain HTTP to link-local services: no root certificates to load (the
        // platform's took 293 stat calls, most of the probe's time).
        let http = reqwest::Client::builder()
            .no_proxy()
            .tls_certs_only([])
            .timeout(BUDGET)
            .connect_timeout(BUDGET)
            .build()
            .ok()?;
        let mut asks = tokio::task::JoinSet::new();
        if let Some(base) = endpoints.aws.clone() {
            asks.spawn(aws(http.clone(), base));
        }
        if let Some(base) = endpoints.gcp.clone() {
            asks.spawn(gcp(http.clone(), base));
        }
        if let Some(base) = endpoints.azure.clone() {
            asks.spawn(azure(http.clone(), base));
        }
        let deadline = tokio::time::Instant::from_std(t0 + BUDGET);
        loop {
            match tokio::time::timeout_at(deadline, asks.join_next()).await {
                Ok(Some(Ok(Some(mut found)))) => {
                    found.millis = t0.elapsed().as_millis() as u64;
                    return Some(found);
                }
                Ok(Some(_)) => continue,
                // All answered with nothing, or the budget is spent.
                Ok(None) | Err(_) => return None,
            }
        }
    })
}

/// An instance type as a service may give it: short, one token, plain characters.
fn plausible(body: &str) -> Option<String> {
    let t = body.trim();
    let ok = !t.is_empty()
        && t.len() <= 64
        && t.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
    ok.then(|| t.to_string())
}

/// A successful answer's body, read chunk by chunk and given up past MAX_ANSWER (a
/// server at that address that streams without end costs nothing).
async fn text(mut resp: reqwest::Response) -> Option<String> {
    if !resp.status().is_success() || resp.content_length().is_some_and(|n| n > MAX_ANSWER as u64) {
        return None;
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.ok()? {
        body.extend_from_slice(&chunk);
        if body.len() > MAX_ANSWER {
            return None;
        }
    }
    Some(String::from_utf8_lossy(&body).into_owned())
}

fn found(provider: &str, instance_type: String, source: String) -> CloudInstance {
    CloudInstance {
        provider: provider.into(),
        instance_type,
        source,
        millis: 0,
    }
}

/// IMDSv2: PUT a session token, then GET the instance type with it.
async fn aws(http: reqwest::Client, base: String) -> Option<CloudInstance> {
    let token = http
        .put(format!("{base}/latest/api/token"))
        .header("X-aws-ec2-metadata-token-ttl-seconds", "60")
        .send()
        .await
        .ok()?;
    let token = text(token).await?;
    let token = token.trim();
    if token.is_empty() || token.len() > 128 || !token.is_ascii() {
        return None;
    }
    let resp = http
        .get(format!("{base}/latest/meta-data/instance-type"))
        .header("X-aws-ec2-metadata-token", token)
        .send()
        .await
        .ok()?;
    let t = plausible(&text(resp).await?)?;
    Some(found("aws", t, format!("AWS IMDSv2 {base}")))
}

/// GCP: the machine type's full name ends in the type; the answer must carry
/// `Metadata-Flavor: Google` (anything else at that address is not GCP's server).
async fn gcp(http: reqwest::Client, base: String) -> Option<CloudInstance> {
    let resp = http
        .get(format!("{base}/computeMetadata/v1/instance/machine-type"))
        .header("Metadata-Flavor", "Google")
        .send()
        .await
        .ok()?;
    let google = resp
        .headers()
        .get("metadata-flavor")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"google"));
    if !google {
        return None;
    }
    let full = text(resp).await?;
    let t = plausible(full.trim().rsplit('/').next()?)?;
    Some(found("gcp", t, format!("GCP metadata server {base}")))
}

/// Azure IMDS: the VM size as text.
async fn azure(http: reqwest::Client, base: String) -> Option<CloudInstance> {
    let resp = http
        .get(format!(
            "{base}/metadata/instance/compute/vmSize?api-version=2021-02-01&format=text"
        ))
        .header("Metadata", "true")
        .send()
        .await
        .ok()?;
    let t = plausible(&text(resp).await?)?;
    Some(found("azure", t, format!("Azure IMDS {base}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Endpoints {
        let m: std::collections::HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Endpoints::from_env(|k| m.get(k).cloned())
    }

    #[test]
    fn endpoints_follow_the_sdks_variables() {
        let d = env(&[]);
        assert_eq!(d.aws.as_deref(), Some("http://169.254.169.254"));
        assert_eq!(d.gcp.as_deref(), Some("http://169.254.169.254"));
        let e = env(&[
            (
                "AWS_EC2_METADATA_SERVICE_ENDPOINT",
                "http://[fd00:ec2::254]/",
            ),
            ("GCE_METADATA_HOST", "127.0.0.1:8080"),
        ]);
        assert_eq!(e.aws.as_deref(), Some("http://[fd00:ec2::254]"));
        assert_eq!(e.gcp.as_deref(), Some("http://127.0.0.1:8080"));
        assert_eq!(env(&[("AWS_EC2_METADATA_DISABLED", "TRUE")]).aws, None);
        assert!(env(&[("AWS_EC2_METADATA_DISABLED", "false")]).aws.is_some());
    }

    #[test]
    fn only_plain_short_names_are_instance_types() {
        assert_eq!(plausible("p5.48xlarge\n").as_deref(), Some("p5.48xlarge"));
        assert_eq!(
            plausible("Standard_ND96isr_H100_v5").as_deref(),
            Some("Standard_ND96isr_H100_v5")
        );
        for bad in ["", "<html><body>404</body></html>", "a b", &"x".repeat(65)] {
            assert_eq!(plausible(bad), None, "{bad}");
        }
    }
}
