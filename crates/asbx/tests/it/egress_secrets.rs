//! Secrets set at the egress proxy, end to end in the jail: a secret bound
//! to a loopback HTTPS server (its CA given through `ASBX_EGRESS_EXTRA_CA`,
//! loopback allowed through `ASBX_ALLOW_INTERNAL`) reaches it as a header
//! from curl, Python and Node, while the sandbox only ever holds the
//! placeholder.

use asbx_protocol::callback::{EnvResponse, InjectedSecret};
use asbx_test_support::tls_server::{TestCa, digest, https_server};

use crate::harness::{FakeWorkspace, RunnerProc, scripted};

const VALUE: &str = "s3cret-VALUE-42";

/// What the sandbox runs: each probe prints `label=<outcome>`.
const PROBES: &str = r#"unset NO_PROXY no_proxy
A=https://127.0.0.1:$PA/echo
code() { grep -o '"code":"[a-z_]*"' || echo none; }
echo "var=$GH_TOKEN"
echo "curl=$(curl -sS $A)"
echo "curl-placeholder=$(curl -sS -H "Authorization: Bearer $GH_TOKEN" $A)"
echo "py=$(python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())' $A 2>&1 | tail -1)"
echo "node=$(node -e 'const {EnvHttpProxyAgent} = require("/usr/lib/node_modules/npm/node_modules/undici"); fetch(process.argv[1], {dispatcher: new EnvHttpProxyAgent()}).then(r => r.text()).then(t => console.log(t), e => console.log("error " + (e.cause || e)))' $A 2>&1 | tail -1)"
echo "ca-var=$SSL_CERT_FILE $NODE_EXTRA_CA_CERTS $REQUESTS_CA_BUNDLE $CURL_CA_BUNDLE $GIT_SSL_CAINFO"
echo "ph-header=$(curl -s -H "Authorization: Bearer $GH_TOKEN" http://127.0.0.1:$PD/x | code)"
echo "ph-url=$(curl -s "http://127.0.0.1:$PD/x?t=$GH_TOKEN" | code)"
echo "ph-body=$(curl -s --data "token=$GH_TOKEN" http://127.0.0.1:$PD/x | code)"
echo "plain=$(curl -s http://127.0.0.1:$PD/x)"
echo "bad-cert=$(curl -s https://127.0.0.1:$PC/echo | code)"
printf '%s\n' "$TEST_CA" > test-ca.pem
echo "unbound=$(curl -sS --cacert test-ca.pem https://127.0.0.1:$PB/echo 2>&1)"
echo "bound-with-upstream-ca=$(curl -s --cacert test-ca.pem https://127.0.0.1:$PA/echo >/dev/null 2>&1; echo $?)"
echo "env-hits=$(env | grep -c s3cret-VALUE)"
echo "proc-hits=$(cat /proc/[0-9]*/environ 2>/dev/null | tr '\0' '\n' | grep -c s3cret-VALUE)"
echo "file-hits=$(grep -rl s3cret-VALUE . /run/asbx /tmp 2>/dev/null | wc -l)"
"#;

#[tokio::test]
async fn bound_secrets_are_set_at_the_proxy_and_never_enter_the_sandbox() {
    let upstream_ca = TestCa::new("asbx test upstream CA");
    let bound = https_server(upstream_ca.server_config("127.0.0.1")).await;
    let open = https_server(upstream_ca.server_config("127.0.0.1")).await;
    let untrusted = https_server(TestCa::new("untrusted CA").server_config("127.0.0.1")).await;
    let plain = crate::egress::upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("upstream-ca.pem");
    std::fs::write(&ca_file, upstream_ca.pem()).unwrap();

    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    ws.set_env(EnvResponse {
        variables: [
            ("GH_TOKEN", "asbx-secret:GH_TOKEN".to_owned()),
            ("PA", bound.port().to_string()),
            ("PB", open.port().to_string()),
            ("PC", untrusted.port().to_string()),
            ("PD", plain.to_string()),
            ("TEST_CA", upstream_ca.pem()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect(),
        allowed_hosts: vec![
            format!("127.0.0.1:{}", open.port()),
            format!("127.0.0.1:{plain}"),
        ],
        injected_secrets: vec![InjectedSecret {
            name: "GH_TOKEN".to_owned(),
            value: VALUE.to_owned(),
            hosts: vec![
                format!("127.0.0.1:{}", bound.port()),
                format!("127.0.0.1:{}", untrusted.port()),
            ],
            header: "Authorization".to_owned(),
            format: "Bearer {value}".to_owned(),
        }],
        ..Default::default()
    });
    let runner = RunnerProc::start(&[
        ("ASBX_ALLOW_INTERNAL", "127.0.0.1/32"),
        ("ASBX_EGRESS_EXTRA_CA", ca_file.to_str().unwrap()),
    ]);
    let (out, lines) = crate::harness::shell(&runner, &ws, PROBES).await;
    let want = format!(
        "authorization={}",
        digest(format!("Bearer {VALUE}").as_bytes())
    );

    assert!(out.contains("var=asbx-secret:GH_TOKEN\n"), "{out}");
    for label in ["curl", "curl-placeholder", "py", "node"] {
        assert!(out.contains(&format!("{label}={want}\n")), "{label}: {out}");
    }
    assert!(
        out.contains("ca-var=/run/asbx/egress-ca.pem /run/asbx/egress-ca.pem"),
        "{out}"
    );
    // The placeholder to an allowed host it is not bound to is refused,
    // wherever it is; the same request without it passes.
    for label in ["ph-header", "ph-url", "ph-body"] {
        assert!(
            out.contains(&format!("{label}=\"code\":\"secret_placeholder\"\n")),
            "{label}: {out}"
        );
    }
    assert!(out.contains("plain=hello-upstream\n"), "{out}");
    // An upstream whose certificate the runner does not trust fails.
    assert!(
        out.contains("bad-cert=\"code\":\"upstream_tls_failed\"\n"),
        "{out}"
    );
    // A host with no bound secret keeps its end-to-end tunnel: the sandbox
    // verifies the upstream's own certificate and no header is added; the
    // bound host's certificate is the sandbox CA's, which that CA file
    // alone does not trust (curl exit 60).
    assert!(out.contains("unbound=authorization=-\n"), "{out}");
    assert!(out.contains("bound-with-upstream-ca=60\n"), "{out}");
    // The value is nowhere inside: environment, /proc, files, output.
    for label in ["env-hits", "proc-hits", "file-hits"] {
        assert!(out.contains(&format!("{label}=0\n")), "{label}: {out}");
    }
    let all = serde_json::to_string(&lines).unwrap();
    assert!(!all.contains(VALUE), "a line carries the value");
    runner.assert_clean().await;
}
