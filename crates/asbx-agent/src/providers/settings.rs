//! Settings of the HTTP providers (OpenAI and Anthropic over the gateway).

use std::time::Duration;

use super::retry::RetryPolicy;

/// Settings of the HTTP providers.
#[derive(Debug, Clone)]
pub struct HttpSettings {
    /// How long a response may stay silent (headers or between chunks).
    pub stall_timeout: Duration,
    pub retry: RetryPolicy,
}

impl Default for HttpSettings {
    fn default() -> Self {
        HttpSettings {
            stall_timeout: Duration::from_secs(60),
            retry: RetryPolicy::default(),
        }
    }
}
