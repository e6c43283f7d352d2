//! Why the proxy refused a request or could not serve it, and the
//! problem+json answer (with its stable code) each refusal gets.

use std::net::IpAddr;

use asbx_protocol::{Problem, ProblemCode};
use axum::response::{IntoResponse, Response};

/// Why the proxy refused a request or could not serve it.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum Refusal {
    #[error("host {0} is not in this sandbox's allowed hosts")]
    NotAllowed(String),
    #[error(
        "port {1} is not allowed for {0}: 443 and 80 only, unless an allowed entry names the port"
    )]
    PortNotAllowed(String, u16),
    #[error("host {0} resolves to an internal address {1}")]
    Internal(String, IpAddr),
    #[error("the Host header {host:?} does not name the request's target {target}")]
    HostMismatch { target: String, host: String },
    #[error("could not resolve {0}")]
    Resolve(String),
    #[error("bad proxy request: {0}")]
    Bad(String),
    #[error("could not connect to {0}: {1}")]
    Connect(String, String),
    #[error("the request carries the placeholder of secret {name}, which is not bound to {host}")]
    SecretPlaceholder { host: String, name: String },
    #[error("TLS to {0} failed: {1}")]
    UpstreamTls(String, String),
}

impl Refusal {
    pub(crate) fn problem(&self) -> Problem {
        let (status, code, title) = match self {
            Refusal::NotAllowed(_) => (403, ProblemCode::EgressHostNotAllowed, "Host not allowed"),
            Refusal::PortNotAllowed(..) => {
                (403, ProblemCode::EgressPortNotAllowed, "Port not allowed")
            }
            Refusal::Internal(..) => (403, ProblemCode::EgressInternalAddress, "Internal address"),
            Refusal::HostMismatch { .. } => {
                (403, ProblemCode::EgressHostMismatch, "Host header mismatch")
            }
            Refusal::Bad(_) => (400, ProblemCode::InvalidRequest, "Bad proxy request"),
            Refusal::Resolve(_) => (
                502,
                ProblemCode::UpstreamUnresolvable,
                "Upstream not resolvable",
            ),
            Refusal::Connect(..) => (
                502,
                ProblemCode::UpstreamUnreachable,
                "Upstream unreachable",
            ),
            Refusal::SecretPlaceholder { .. } => (
                403,
                ProblemCode::SecretPlaceholder,
                "Secret placeholder to another host",
            ),
            Refusal::UpstreamTls(..) => {
                (502, ProblemCode::UpstreamTlsFailed, "Upstream TLS failed")
            }
        };
        Problem::of(status, code, title, self.to_string())
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        tracing::debug!(refusal = %self, "egress refused");
        crate::error::problem_response(&self.problem())
    }
}
