//! `asbx up`: the workspace and the runner together, on loopback, the
//! runner reachable only with a token its workspace holds.

use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use asbx_workspace::{Workspace, WorkspaceConfig};

use crate::cli::{RunnerOpts, UpArgs};
use crate::cmd::runner::start_runner;
use crate::cmd::shared::{
    absolute_data_dir, apply_secret_key, apply_workspace_opts, print_line, sandbox_fds,
    shutdown_signal,
};
use crate::listen::{Limits, serve};

pub(super) async fn run(mut args: UpArgs) -> anyhow::Result<ExitCode> {
    let data = absolute_data_dir(&args.data)?;
    let operator_token = private_runner_token(&mut args.runner);
    let runner_listener = crate::listen::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .context("binding the runner to a loopback port")?;
    let runner_url = format!("http://{}", runner_listener.local_addr()?);
    let listener = crate::listen::bind(args.listen)
        .with_context(|| format!("binding {} (set --listen or ASBX_LISTEN)", args.listen))?;
    let addr = listener.local_addr()?;
    // Sandboxes call this workspace back: its origin is the runner's.
    let runner = start_runner(&args.runner, &data, Some(format!("http://{addr}")))?;
    let (config, model) = workspace_config(&args, &data, addr, &runner_url)?;
    let workspace = Workspace::open(config)
        .await
        .context("opening the workspace")?;
    print_line(&banner(
        runner.profile(),
        &model,
        addr,
        &runner_url,
        operator_token,
        &data,
    ));
    runner.warm_up();
    let stop = shutdown_signal();
    // One connection budget for the process, its two listeners together.
    let limits = Limits::new(&args.conns, sandbox_fds(&args.runner));
    let runner_srv = serve(
        runner_listener,
        runner.router(),
        stop.clone(),
        limits.clone(),
    );
    let ws_srv = serve(listener, workspace.router(), stop, limits);
    let served = tokio::try_join!(runner_srv, ws_srv);
    runner.shutdown().await;
    served?;
    Ok(ExitCode::SUCCESS)
}

/// The runner is never open to every local process: without an operator's
/// token, `up` makes a fresh one that only its own workspace holds. True
/// when the operator set one.
fn private_runner_token(opts: &mut RunnerOpts) -> bool {
    let operator_token = opts.token.as_deref().is_some_and(|t| !t.is_empty());
    if !operator_token {
        opts.token = Some(hex::encode(rand::random::<[u8; 32]>()));
    }
    operator_token
}

/// The workspace's settings, pointed at its runner, and its default model.
fn workspace_config(
    args: &UpArgs,
    data: &Path,
    addr: SocketAddr,
    runner_url: &str,
) -> anyhow::Result<(WorkspaceConfig, String)> {
    let mut config =
        WorkspaceConfig::new(data.join("workspace"), format!("http://{addr}").parse()?);
    apply_workspace_opts(&mut config, &args.workspace);
    apply_secret_key(&mut config, &args.secrets);
    let (model, models) = up_models(args.model.as_deref(), &config.models, &args.runner);
    config.models = models;
    config.sandbox_url = Some(runner_url.parse()?);
    config.default_model = model.clone();
    config.listen = Some(addr);
    config.runner_token = args.runner.token.clone();
    Ok((config, model))
}

/// What `up` prints once both listen. The runner's own routes (protocol 2
/// sessions, events) answer only its bearer: the operator's
/// ASBX_RUNNER_TOKEN if set, else the one `up` made, which only this
/// workspace holds.
fn banner(
    profile: &str,
    model: &str,
    addr: SocketAddr,
    runner_url: &str,
    operator_token: bool,
    data: &Path,
) -> String {
    let bearer = match operator_token {
        true => "bearer: ASBX_RUNNER_TOKEN",
        false => "bearer: private to this workspace; set ASBX_RUNNER_TOKEN to call it",
    };
    format!(
        "asbx is up (isolation: {profile}, model: {model})\n  open    http://{addr}\n  try     asbx run \"what is in your sandbox?\"\n  runner  {runner_url} ({bearer})\n  data    {}",
        data.display()
    )
}

/// `up`'s default model and the models a chat may choose: `ASBX_MODELS`
/// when set (its first the default unless `ASBX_MODEL` names one), else
/// [`provider_models`] and [`default_model`].
fn up_models(
    explicit: Option<&str>,
    listed: &[String],
    opts: &RunnerOpts,
) -> (String, Vec<String>) {
    match (explicit, listed.first()) {
        (_, None) => (default_model(explicit, opts), provider_models(opts)),
        (None, Some(first)) => (first.clone(), listed.to_vec()),
        (Some(m), Some(_)) => (m.to_owned(), listed.to_vec()),
    }
}

/// The models `up` offers without `ASBX_MODELS`: those of the providers it
/// configures the runner with (the default first, as [`default_model`]
/// picks it), and the scripted model, always there.
fn provider_models(opts: &RunnerOpts) -> Vec<String> {
    let mut out = Vec::new();
    if opts.openai_api_key.is_some() {
        out.push("openai:gpt-4.1-mini".to_owned());
    }
    if opts.anthropic_api_key.is_some() {
        out.push("anthropic:claude-sonnet-4-5".to_owned());
    }
    out.push("scripted:demo".to_owned());
    out
}

fn default_model(explicit: Option<&str>, opts: &RunnerOpts) -> String {
    match explicit {
        Some(m) => m.to_owned(),
        None if opts.openai_api_key.is_some() => "openai:gpt-4.1-mini".to_owned(),
        None if opts.anthropic_api_key.is_some() => "anthropic:claude-sonnet-4-5".to_owned(),
        None => "scripted:demo".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use crate::cli::{Cli, Command};

    fn runner_opts(args: &[&str]) -> RunnerOpts {
        let argv = ["asbx", "up"].iter().chain(args).copied();
        match Cli::try_parse_from(argv).map(|c| c.command) {
            Ok(Command::Up(up)) => up.runner,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn up_lists_its_providers_models_unless_told_which() {
        let with_openai = runner_opts(&["--openai-api-key", "k", "--anthropic-api-key", "k"]);
        let (default, models) = up_models(None, &[], &with_openai);
        assert_eq!(default, "openai:gpt-4.1-mini");
        assert_eq!(
            models,
            [
                "openai:gpt-4.1-mini",
                "anthropic:claude-sonnet-4-5",
                "scripted:demo"
            ]
        );
        let listed = vec!["ollama:llama3".to_owned(), "scripted:demo".to_owned()];
        assert_eq!(
            up_models(None, &listed, &with_openai),
            ("ollama:llama3".to_owned(), listed.clone())
        );
        assert_eq!(
            up_models(Some("scripted:demo"), &listed, &with_openai).0,
            "scripted:demo"
        );
    }
}
