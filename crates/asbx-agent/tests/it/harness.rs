//! Test harness: builds a bootstrap, starts the fake gateway (and a mock
//! provider when asked), runs the agent in process, and collects its lines.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a failed setup is a failed test

use std::path::PathBuf;
use std::time::Duration;

use asbx_agent::{AgentOptions, HttpSettings, RetryPolicy};
use asbx_protocol::callback::{ConfigResponse, EnvResponse, RunLimits};
use asbx_protocol::dispatch::ClientTool;
use asbx_protocol::gateway::{AgentBootstrap, MaxLimits, ProviderInfo, ProviderKind};
use asbx_protocol::line::{Step, StepStatus};
use asbx_protocol::raw::AgentEvent;
use asbx_protocol::{Event, Protocol};
use asbx_test_support::{FakeGateway, GatewayConfig, GatewayProvider, MockProvider};
use tokio::io::{AsyncBufReadExt, BufReader, DuplexStream, Lines};

pub(crate) const KEY: &str = "sk-test-key";

pub(crate) struct Harness {
    pub dir: tempfile::TempDir,
    pub workdir: PathBuf,
    pub gw: GatewayConfig,
    pub prompt: String,
    pub protocol: Protocol,
    pub otp_setup: String,
    pub otp_run: String,
    pub otp_upload: Option<String>,
    pub proxy_socket: Option<String>,
    pub max_limits: MaxLimits,
    pub providers: Vec<ProviderInfo>,
    pub options: AgentOptions,
    pub mock: Option<MockProvider>,
    pub client_tools: Vec<ClientTool>,
}

pub(crate) struct Outcome {
    pub events: Vec<Event>,
    pub gateway: FakeGateway,
    pub mock: Option<MockProvider>,
    pub workdir: PathBuf,
    pub _dir: tempfile::TempDir,
}

pub(crate) fn test_options() -> AgentOptions {
    AgentOptions {
        http: HttpSettings {
            stall_timeout: Duration::from_secs(10),
            retry: RetryPolicy {
                max_attempts: 4,
                base_delay: Duration::from_millis(10),
                max_delay: Duration::from_millis(100),
                budget: Duration::from_secs(30),
            },
        },
    }
}

impl Harness {
    /// The scripted model with `prompt`.
    pub(crate) fn scripted(prompt: &str) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let workdir = dir.path().join("work");
        std::fs::create_dir(&workdir).unwrap();
        Harness {
            gw: GatewayConfig {
                otp_setup: "otp-setup".into(),
                otp_run: "otp-run".into(),
                otp_upload: Some("otp-upload".into()),
                env: EnvResponse::default(),
                config: ConfigResponse {
                    model: "scripted:test".into(),
                    ..Default::default()
                },
                providers: vec![],
                workspace: None,
            },
            dir,
            workdir,
            prompt: prompt.into(),
            protocol: Protocol::V1,
            otp_setup: "otp-setup".into(),
            otp_run: "otp-run".into(),
            otp_upload: Some("otp-upload".into()),
            proxy_socket: None,
            max_limits: MaxLimits::default(),
            providers: vec![],
            options: test_options(),
            mock: None,
            client_tools: vec![],
        }
    }

    /// A mock provider of `kind`, registered as provider `mock`.
    pub(crate) async fn with_mock(kind: ProviderKind) -> Harness {
        let mut h = Harness::scripted("Please do the thing.");
        let mock = MockProvider::start().await;
        h.gw.providers.push(GatewayProvider {
            name: "mock".into(),
            kind,
            base_url: mock.base_url.clone(),
            key: KEY.into(),
        });
        h.providers.push(ProviderInfo {
            name: "mock".into(),
            kind,
        });
        h.gw.config.model = "mock:test-model".into();
        h.mock = Some(mock);
        h
    }

    pub(crate) fn mock(&self) -> &MockProvider {
        self.mock.as_ref().unwrap()
    }

    pub(crate) fn limits(&mut self, l: RunLimits) -> &mut Self {
        self.gw.config.limits = Some(l);
        self
    }

    pub(crate) async fn run(self) -> Outcome {
        self.start().await.finish().await
    }

    /// Starts the agent and returns at once, so the test can read its lines
    /// as they come and talk to the gateway meanwhile.
    pub(crate) async fn start(self) -> Live {
        let gateway = FakeGateway::start(self.dir.path(), self.gw.clone()).await;
        let bootstrap = AgentBootstrap {
            session_id: "s_test".into(),
            protocol: self.protocol,
            prompt: self.prompt.clone(),
            otp_setup: self.otp_setup.clone(),
            otp_run: self.otp_run.clone(),
            otp_upload: self.otp_upload.clone(),
            gateway_socket: gateway.socket.display().to_string(),
            proxy_socket: self.proxy_socket.clone(),
            workdir: self.workdir.display().to_string(),
            providers: self.providers.clone(),
            max_limits: self.max_limits,
            client_tools: self.client_tools.clone(),
            tool_user: None,
        };
        let (w, r) = tokio::io::duplex(64 * 1024);
        let options = self.options.clone();
        let agent = tokio::spawn(async move {
            asbx_agent::run(bootstrap, options, w).await.unwrap();
        });
        Live {
            gateway,
            lines: BufReader::new(r).lines(),
            agent,
            events: Vec::new(),
            protocol: self.protocol,
            mock: self.mock,
            workdir: self.workdir,
            dir: self.dir,
        }
    }
}

/// A running agent: its lines so far, and the gateway it talks to.
pub(crate) struct Live {
    pub gateway: FakeGateway,
    lines: Lines<BufReader<DuplexStream>>,
    agent: tokio::task::JoinHandle<()>,
    /// Every event read so far, in order.
    pub events: Vec<Event>,
    protocol: Protocol,
    mock: Option<MockProvider>,
    workdir: PathBuf,
    dir: tempfile::TempDir,
}

impl Live {
    /// The next line, checked as the runner would check it; `None` at the end.
    pub(crate) async fn next(&mut self) -> Option<Event> {
        let l = self.lines.next_line().await.unwrap()?;
        // Every line must pass the runner's validator as is.
        let (kind, _) = AgentEvent::parse(l.as_bytes())
            .unwrap_or_else(|e| panic!("runner would reject {l}: {e}"));
        if self.protocol == Protocol::V1 {
            assert!(kind.in_protocol1(), "protocol 2 line in protocol 1: {l}");
        }
        let e = serde_json::from_str::<Event>(&l).unwrap();
        self.events.push(e.clone());
        Some(e)
    }

    /// Reads lines until one of type `ty`, which it returns.
    pub(crate) async fn until(&mut self, ty: &str) -> Event {
        loop {
            match self.next().await {
                Some(e) if e.type_name() == ty => return e,
                Some(_) => {}
                None => panic!("no {ty} line before the end: {:#?}", self.events),
            }
        }
    }

    /// Reads the rest and waits for the agent to finish.
    pub(crate) async fn finish(mut self) -> Outcome {
        while self.next().await.is_some() {}
        self.agent.await.unwrap();
        Outcome {
            events: self.events,
            gateway: self.gateway,
            mock: self.mock,
            workdir: self.workdir,
            _dir: self.dir,
        }
    }
}

impl Outcome {
    pub(crate) fn steps(&self) -> Vec<&Step> {
        self.events
            .iter()
            .filter_map(|e| match e {
                Event::Step(s) => Some(s),
                _ => None,
            })
            .collect()
    }

    /// The finished steps in order, checking every step id is `running` first
    /// and then finished exactly once.
    pub(crate) fn finished_steps(&self) -> Vec<&Step> {
        let steps = self.steps();
        let mut finished = Vec::new();
        for (i, s) in steps.iter().enumerate() {
            if s.status == StepStatus::Running {
                let ends: Vec<_> = steps[i + 1..].iter().filter(|o| o.id == s.id).collect();
                assert_eq!(ends.len(), 1, "step {} must finish exactly once", s.id);
                assert_ne!(ends[0].status, StepStatus::Running);
                assert!(ends[0].duration_ms.is_some());
            } else {
                assert!(
                    steps[..i]
                        .iter()
                        .any(|o| o.id == s.id && o.status == StepStatus::Running),
                    "step {} finished before it ran",
                    s.id
                );
                finished.push(*s);
            }
        }
        finished
    }

    /// The single terminal line, which must be the last line.
    pub(crate) fn terminal(&self) -> &Event {
        let n = self.events.iter().filter(|e| e.is_terminal()).count();
        assert_eq!(n, 1, "exactly one terminal line: {:#?}", self.events);
        let last = self.events.last().unwrap();
        assert!(last.is_terminal(), "terminal line must be last");
        last
    }

    pub(crate) fn result(&self) -> &str {
        match self.terminal() {
            Event::Result(r) => &r.message,
            other => panic!("expected result, got {other:?}"),
        }
    }

    pub(crate) fn error(&self) -> (&str, &str) {
        match self.terminal() {
            Event::Error(e) => (&e.code, &e.message),
            other => panic!("expected error, got {other:?}"),
        }
    }

    pub(crate) fn first_is_sandbox_started(&self) {
        match &self.events[0] {
            Event::Log(l) => assert_eq!(l.message, "sandbox started"),
            other => panic!("first line: {other:?}"),
        }
    }
}

/// Runs the agent in process and returns its stdout lines.
pub(crate) async fn collect(bootstrap: AgentBootstrap, options: AgentOptions) -> Vec<String> {
    let (w, r) = tokio::io::duplex(64 * 1024);
    let reader = tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(r).lines();
        let mut out = Vec::new();
        while let Some(l) = lines.next_line().await.unwrap() {
            out.push(l);
        }
        out
    });
    asbx_agent::run(bootstrap, options, w).await.unwrap();
    reader.await.unwrap()
}

pub(crate) fn script(v: serde_json::Value) -> String {
    serde_json::json!({ "script": v }).to_string()
}
