//! Model providers behind one trait.
//!
//! The loop speaks a provider-neutral conversation ([`Message`]) and gets
//! back one complete [`ModelTurn`] per call. A provider only returns a turn
//! once its response is complete, so a stream cut in the middle is retried
//! from scratch and never half-applied; `delta` lines already written for a
//! cut attempt stay on the wire (protocol 2 only), which consumers must
//! tolerate.
//!
//! The model string is `provider:model`. `scripted` is built in and needs no
//! gateway; any other name is looked up in the bootstrap's provider list.

pub(crate) mod anthropic;
mod model;
pub(crate) mod openai;
pub(crate) mod retry;
pub(crate) mod scripted;
mod settings;
pub(crate) mod sse;

use asbx_protocol::gateway::{ProviderInfo, ProviderKind};

use crate::gateway_client::GatewayClient;

pub(crate) use model::{
    DeltaSink, Message, ModelError, ModelRequest, Provider, ToolCallRequest, ToolSpec, Usage,
};
pub use retry::RetryPolicy;
pub use settings::HttpSettings;

/// Splits `provider:model`, the model part may itself contain colons.
pub(crate) fn split_model(model: &str) -> Result<(&str, &str), ModelError> {
    match model.split_once(':') {
        Some((p, m)) if !p.is_empty() => Ok((p, m)),
        _ => Err(ModelError::BadModel(model.to_owned())),
    }
}

/// Builds the provider for `provider:model`.
pub(crate) fn build(
    model: &str,
    providers: &[ProviderInfo],
    gateway: &GatewayClient,
    settings: &HttpSettings,
) -> Result<(Box<dyn Provider>, String), ModelError> {
    let (name, model_name) = split_model(model)?;
    if name == scripted::NAME {
        return Ok((
            Box::new(scripted::Scripted::default()),
            model_name.to_owned(),
        ));
    }
    let info = providers
        .iter()
        .find(|p| p.name == name)
        .ok_or_else(|| ModelError::UnknownProvider(name.to_owned()))?;
    let provider: Box<dyn Provider> = match info.kind {
        ProviderKind::Openai => Box::new(openai::OpenAi::new(
            gateway.clone(),
            name.to_owned(),
            settings.clone(),
        )),
        ProviderKind::Anthropic => Box::new(anthropic::Anthropic::new(
            gateway.clone(),
            name.to_owned(),
            settings.clone(),
        )),
    };
    Ok((provider, model_name.to_owned()))
}
