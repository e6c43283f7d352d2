//! A minimal HTTP/1.1 client for the gateway's Unix socket.
//!
//! The sandbox has no network; the gateway socket is the only way out. One
//! connection per request (hyper's `conn::http1`), which keeps the client
//! free of pooling state; the gateway is local, so connecting is cheap.

use std::path::PathBuf;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::net::UnixStream;

/// The largest non-streaming response body the agent accepts.
pub(crate) const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// A failure talking to the gateway.
#[derive(Debug, thiserror::Error)]
pub(crate) enum GatewayError {
    #[error("cannot connect to the gateway socket {path}: {source}")]
    Connect {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("gateway http error: {0}")]
    Http(#[from] hyper::Error),
    #[error("cannot build request: {0}")]
    Request(#[from] http::Error),
    #[error("gateway answered {status}: {body}")]
    Status { status: StatusCode, body: String },
    #[error("cannot read response body: {0}")]
    Body(String),
    #[error("invalid json: {0}")]
    Json(#[from] serde_json::Error),
}

impl GatewayError {
    /// The status the gateway answered with, if it answered at all.
    pub(crate) fn status(&self) -> Option<StatusCode> {
        match self {
            GatewayError::Status { status, .. } => Some(*status),
            GatewayError::Connect { .. }
            | GatewayError::Http(_)
            | GatewayError::Request(_)
            | GatewayError::Body(_)
            | GatewayError::Json(_) => None,
        }
    }
}

/// The gateway at one Unix socket path.
#[derive(Debug, Clone)]
pub(crate) struct GatewayClient {
    socket: PathBuf,
}

impl GatewayClient {
    pub(crate) fn new(socket: impl Into<PathBuf>) -> Self {
        GatewayClient {
            socket: socket.into(),
        }
    }

    /// Sends one request and returns the response with its body unread.
    pub(crate) async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Result<Response<Incoming>, GatewayError> {
        let json: &[(&str, &str)] = if body.is_empty() {
            &[]
        } else {
            &[(header::CONTENT_TYPE.as_str(), "application/json")]
        };
        let all: Vec<(&str, &str)> = headers.iter().chain(json).copied().collect();
        self.send_body(method, path, &all, Full::new(body)).await
    }

    /// Sends one request with any body (streamed as it is polled) and
    /// exactly `headers`; returns the response with its body unread.
    pub(crate) async fn send_body<B>(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: B,
    ) -> Result<Response<Incoming>, GatewayError>
    where
        B: hyper::body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let stream =
            UnixStream::connect(&self.socket)
                .await
                .map_err(|source| GatewayError::Connect {
                    path: self.socket.display().to_string(),
                    source,
                })?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!("gateway connection ended: {e}");
            }
        });
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, "gateway");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(body)?;
        Ok(sender.send_request(req).await?)
    }

    /// Sends a request and reads the whole body (bounded), failing on non-2xx.
    pub(crate) async fn send_collect(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Result<Bytes, GatewayError> {
        let resp = self.send(method, path, headers, body).await?;
        let status = resp.status();
        let bytes = read_body(resp.into_body(), MAX_BODY_BYTES).await?;
        if !status.is_success() {
            return Err(GatewayError::Status {
                status,
                body: String::from_utf8_lossy(&bytes[..bytes.len().min(2048)]).into_owned(),
            });
        }
        Ok(bytes)
    }

    /// `GET` with a bearer token, decoding a JSON answer.
    pub(crate) async fn get_json<T: DeserializeOwned>(
        &self,
        path: &str,
        token: &str,
    ) -> Result<T, GatewayError> {
        let auth = format!("Bearer {token}");
        let bytes = self
            .send_collect(
                Method::GET,
                path,
                &[(header::AUTHORIZATION.as_str(), &auth)],
                Bytes::new(),
            )
            .await?;
        Ok(serde_json::from_slice(&bytes)?)
    }

    /// `POST` JSON with a bearer token, decoding a JSON answer.
    pub(crate) async fn post_json<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        token: &str,
        body: &B,
    ) -> Result<T, GatewayError> {
        let auth = format!("Bearer {token}");
        let body = Bytes::from(serde_json::to_vec(body)?);
        let bytes = self
            .send_collect(
                Method::POST,
                path,
                &[(header::AUTHORIZATION.as_str(), &auth)],
                body,
            )
            .await?;
        Ok(serde_json::from_slice(&bytes)?)
    }
}

/// Reads a whole body, refusing more than `limit` bytes.
pub(crate) async fn read_body(body: Incoming, limit: usize) -> Result<Bytes, GatewayError> {
    Limited::new(body, limit)
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| GatewayError::Body(e.to_string()))
}
