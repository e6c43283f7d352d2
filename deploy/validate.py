"""Offline checks of deploy/kubernetes, run by deploy/validate.sh in a venv
that has kubernetes-validate (which bundles the Kubernetes JSON schemas).

1. Every manifest document is validated, strictly (unknown fields are
   errors), against the schemas of one Kubernetes version. A kind without a
   schema is an error, except the CRDs listed in CRD_CHECKS, which are
   skipped with a printed note and only given the small structural check
   written here (no upstream CRD schema is vendored).
2. Kustomizations are checked without kustomize: every listed resource
   exists, every manifest is listed somewhere, and each JSON 6902 patch is
   applied here to the base resource it targets and the result validated.
3. Rules the schemas cannot express: settings names exist in the `asbx`
   command line (crates/asbx/src/cli.rs), references to ConfigMaps, Secrets
   and pod labels resolve, the workspace is locked down, the runner has
   exactly the jail's capabilities and is not privileged, the runners
   accept the workspace's ASBX_PUBLIC_URL origin, authentication is on off
   loopback.
"""

import argparse
import copy
import os
import re
import sys
import urllib.parse

import yaml
import kubernetes_validate
from kubernetes_validate.utils import SchemaNotFoundError

# The capabilities the jail needs (docs/deploy.md, "The runner's privileges").
RUNNER_CAPS = {
    "SYS_ADMIN", "NET_ADMIN", "SETUID", "SETGID", "CHOWN",
    "FOWNER", "DAC_OVERRIDE", "MKNOD", "KILL",
}
# Read by the binary outside clap (tracing's filter).
EXTRA_ENV = {"ASBX_LOG"}
# Settings whose command-line side is being added (issue 13): a NOTE, not an
# error, while crates/asbx/src/cli.rs does not name them yet.
PENDING_ENV = {"ASBX_WORKSPACE_ORIGINS"}
# Secrets made by something else than these manifests.
EXTERNAL_SECRETS = {("asbx", "asbx-db-app")}  # CloudNativePG's app secret
NOT_IN_KUSTOMIZE = {"secrets.example.yaml"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume",
                  "StorageClass", "CustomResourceDefinition"}
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet"}


def cnpg_cluster(doc):
    errs = []
    spec = doc.get("spec") or {}
    if not isinstance(spec.get("instances"), int) or spec["instances"] < 1:
        errs.append("spec.instances must be an integer >= 1")
    if not isinstance((spec.get("storage") or {}).get("size"), str):
        errs.append("spec.storage.size must be a quantity string")
    initdb = (spec.get("bootstrap") or {}).get("initdb") or {}
    for k in ("database", "owner"):
        if not isinstance(initdb.get(k), str):
            errs.append(f"spec.bootstrap.initdb.{k} must be a string")
    return errs


CRD_CHECKS = {("postgresql.cnpg.io/v1", "Cluster"): cnpg_cluster}


class Report:
    def __init__(self):
        self.errors = 0
        self.validated = 0
        self.skipped = 0
        self.rules = 0

    def error(self, where, msg):
        self.errors += 1
        print(f"ERROR {where}: {msg}")

    def note(self, msg):
        print(f"NOTE  {msg}")


def name_of(doc):
    md = doc.get("metadata") or {}
    return f"{doc.get('kind')}/{md.get('namespace', '-')}/{md.get('name')}"


def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def validate_doc(rep, where, doc, version):
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key in CRD_CHECKS:
        rep.skipped += 1
        rep.note(f"{where}: {name_of(doc)} is a CRD ({key[0]}), not in the Kubernetes "
                 f"schemas: skipped, only its required fields are checked here")
        for e in CRD_CHECKS[key](doc):
            rep.error(where, f"{name_of(doc)}: {e}")
        return
    try:
        kubernetes_validate.validate(doc, version, strict=True)
        rep.validated += 1
    except SchemaNotFoundError as e:
        rep.error(where, f"{name_of(doc)}: no schema: {e}")
    except kubernetes_validate.ValidationError as e:
        path = ".".join(str(p) for p in e.path)
        rep.error(where, f"{name_of(doc)} is invalid for Kubernetes {version}: {path}: {e.message}")


def pointer_get(obj, ptr):
    for part in ptr.lstrip("/").split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        obj = obj[int(part)] if isinstance(obj, list) else obj[part]
    return obj


def apply_json_patch(doc, ops):
    doc = copy.deepcopy(doc)
    for op in ops:
        parent_ptr, _, last = op["path"].rpartition("/")
        parent = pointer_get(doc, parent_ptr) if parent_ptr else doc
        key = int(last) if isinstance(parent, list) else last
        if op["op"] == "test":
            if parent[key] != op["value"]:
                raise ValueError(f"test {op['path']}: {parent[key]!r} != {op['value']!r}")
        elif op["op"] in ("replace", "add"):
            if op["op"] == "replace":
                parent[key]  # must exist
            parent[key] = op["value"]
        elif op["op"] == "remove":
            del parent[key]
        else:
            raise ValueError(f"op {op['op']} not supported by this checker")
    return doc


def kustomize_docs(rep, kdir, version, seen_files):
    """The resources a kustomization directory stands for (patches applied)."""
    kfile = os.path.join(kdir, "kustomization.yaml")
    k = load(kfile)[0]
    seen_files.add(os.path.realpath(kfile))
    docs = []
    for res in k.get("resources", []):
        path = os.path.normpath(os.path.join(kdir, res))
        if os.path.isdir(path):
            if not os.path.exists(os.path.join(path, "kustomization.yaml")):
                rep.error(kfile, f"resource {res} is a folder without kustomization.yaml")
                continue
            docs += kustomize_docs(rep, path, version, seen_files)
        elif os.path.isfile(path):
            seen_files.add(os.path.realpath(path))
            docs += [(path, d) for d in load(path)]
        else:
            rep.error(kfile, f"resource {res} does not exist")
    for p in k.get("patches", []):
        t = p.get("target") or {}
        ops = yaml.safe_load(p.get("patch", "[]"))
        matches = [i for i, (_, d) in enumerate(docs)
                   if d.get("kind") == t.get("kind")
                   and d["metadata"].get("name") == t.get("name")
                   and d["metadata"].get("namespace") == t.get("namespace")]
        if len(matches) != 1:
            rep.error(kfile, f"patch target {t} matches {len(matches)} resources")
            continue
        i = matches[0]
        try:
            patched = apply_json_patch(docs[i][1], ops)
        except (KeyError, IndexError, ValueError, TypeError) as e:
            rep.error(kfile, f"patch on {name_of(docs[i][1])} does not apply: {e!r}")
            continue
        rep.note(f"{kfile}: patch applied to {name_of(patched)}; validating the result")
        validate_doc(rep, kfile + " (patched)", patched, version)
        docs[i] = (kfile + " (patched)", patched)
    return docs


def containers(doc):
    return doc["spec"]["template"]["spec"].get("containers", [])


def check_rules(rep, where, docs, env_names):
    """Rules on one kustomization's full set of resources."""
    index = {}
    for src, d in docs:
        md = d.get("metadata") or {}
        key = (d.get("kind"), md.get("namespace"), md.get("name"))
        if key in index:
            rep.error(where, f"{name_of(d)} defined twice ({index[key]} and {src})")
        index[key] = src
        if d.get("kind") not in CLUSTER_SCOPED and not md.get("namespace"):
            rep.error(src, f"{name_of(d)} names no namespace")
        if d.get("kind") == "Secret":
            rep.error(src, f"{name_of(d)}: Secrets stay out of kustomizations")
    objs = [d for _, d in docs]
    by = lambda kind: [d for d in objs if d.get("kind") == kind]
    cms = {(d["metadata"]["namespace"], d["metadata"]["name"]): d.get("data", {}) for d in by("ConfigMap")}
    workloads = [d for d in objs if d.get("kind") in WORKLOADS]

    def pods_match(ns, selector):
        return any(w["metadata"]["namespace"] == ns and
                   all(w["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in selector.items())
                   for w in workloads)

    # References from pods.
    for w in workloads:
        ns = w["metadata"]["namespace"]
        rep.rules += 1
        for c in containers(w):
            for e in c.get("env", []):
                if env_names is not None and e["name"] not in env_names:
                    rep.error(where, f"{name_of(w)}: env {e['name']} is not a setting of asbx")
                ref = (e.get("valueFrom") or {})
                if "secretKeyRef" in ref and not ref["secretKeyRef"].get("optional"):
                    sec = (ns, ref["secretKeyRef"]["name"])
                    if sec not in SECRETS and sec not in EXTERNAL_SECRETS:
                        rep.error(where, f"{name_of(w)}: Secret {sec} is made nowhere "
                                         f"(secrets.example.yaml or EXTERNAL_SECRETS)")
                    elif sec in SECRETS and ref["secretKeyRef"]["key"] not in SECRETS[sec]:
                        rep.error(where, f"{name_of(w)}: Secret {sec} has no key {ref['secretKeyRef']['key']}")
            for ef in c.get("envFrom", []):
                cm = (ns, ef.get("configMapRef", {}).get("name"))
                if cm not in cms:
                    rep.error(where, f"{name_of(w)}: ConfigMap {cm} is not defined")
                    continue
                for k in cms[cm]:
                    if env_names is not None and k not in env_names:
                        rep.error(where, f"ConfigMap {cm}: {k} is not a setting of asbx")
    for kind in ("Service", "PodDisruptionBudget"):
        for d in by(kind):
            rep.rules += 1
            sel = d["spec"]["selector"]
            sel = sel.get("matchLabels", {}) if kind == "PodDisruptionBudget" else sel
            if not pods_match(d["metadata"]["namespace"], sel):
                rep.error(where, f"{name_of(d)}: selector {sel} matches no pod template")
    for d in by("NetworkPolicy"):
        rep.rules += 1
        sel = d["spec"]["podSelector"].get("matchLabels", {})
        if sel and not pods_match(d["metadata"]["namespace"], sel):
            rep.error(where, f"{name_of(d)}: podSelector {sel} matches no pod template")

    for w in workloads:
        comp = w["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component")
        pod = w["spec"]["template"]["spec"]
        for c in containers(w):
            sc = c.get("securityContext") or {}
            caps = set((sc.get("capabilities") or {}).get("add", []))
            rep.rules += 1
            if sc.get("privileged"):
                rep.error(where, f"{name_of(w)}/{c['name']}: privileged: true")
            if "SYS_ADMIN" in caps and sc.get("allowPrivilegeEscalation") is False:
                rep.error(where, f"{name_of(w)}/{c['name']}: the API refuses "
                                 "allowPrivilegeEscalation: false with CAP_SYS_ADMIN")
            if (sc.get("capabilities") or {}).get("drop") != ["ALL"]:
                rep.error(where, f"{name_of(w)}/{c['name']}: must drop ALL capabilities")
            if comp == "workspace":
                want = {
                    "runAsNonRoot": sc.get("runAsNonRoot", (pod.get("securityContext") or {}).get("runAsNonRoot")),
                    "readOnlyRootFilesystem": sc.get("readOnlyRootFilesystem"),
                    "allowPrivilegeEscalation is false": sc.get("allowPrivilegeEscalation") is False,
                    "seccomp RuntimeDefault": (sc.get("seccompProfile") or {}).get("type") == "RuntimeDefault",
                    "no added capability": not caps,
                }
                for what, ok in want.items():
                    if not ok:
                        rep.error(where, f"{name_of(w)}/{c['name']}: workspace needs {what}")
                check_workspace_probes(rep, where, w, c, cms)
            elif comp == "runner":
                if caps != RUNNER_CAPS:
                    rep.error(where, f"{name_of(w)}/{c['name']}: capabilities {sorted(caps)} "
                                     f"!= the jail's {sorted(RUNNER_CAPS)}")
                if pod.get("hostUsers") is False:
                    rep.error(where, f"{name_of(w)}: the jail needs hostUsers (uid maps from 1000000)")
                # Runners on one node claim their host uid blocks in one
                # folder (crates/asbx-runner/src/uids.rs): the node's, not
                # the container's.
                mounts = {m.get("name"): m.get("mountPath") for m in c.get("volumeMounts") or []}
                host_paths = {v.get("name"): (v.get("hostPath") or {}).get("path")
                              for v in pod.get("volumes") or []}
                if not any(path == "/run/asbx-uids" and host_paths.get(name)
                           for name, path in mounts.items()):
                    rep.error(where, f"{name_of(w)}/{c['name']}: /run/asbx-uids must be a hostPath "
                                     "(runners on one node claim their host uids there)")
    check_origins(rep, where, cms)
    for (ns, name), data in cms.items():
        rep.rules += 1
        listen = data.get("ASBX_LISTEN")
        if listen and not listen.startswith(("127.", "[::1]", "localhost")):
            if str(data.get("ASBX_REQUIRE_AUTH", "")).lower() not in ("1", "true", "yes", "on"):
                rep.error(where, f"ConfigMap {ns}/{name}: listens on {listen} without ASBX_REQUIRE_AUTH")


def check_workspace_probes(rep, where, w, c, cms):
    # Alive is the process (/healthz); ready is the process with its
    # database (/readyz): a replica cut off from PostgreSQL is taken out of
    # the Service, not restarted. Both are exempt from the Host guard.
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        if (c.get(probe) or {}).get("httpGet", {}).get("path") != path:
            rep.error(where, f"{name_of(w)}: {probe} must be httpGet {path}")


def check_origins(rep, where, cms):
    """The runners accept agent_urls only at ASBX_WORKSPACE_ORIGINS, and the
    workspace builds them from ASBX_PUBLIC_URL: the two must agree."""
    publics = {v["ASBX_PUBLIC_URL"] for v in cms.values() if "ASBX_PUBLIC_URL" in v}
    origins = set()
    for v in cms.values():
        origins |= {o.strip().rstrip("/") for o in v.get("ASBX_WORKSPACE_ORIGINS", "").split(",") if o.strip()}
    for public in publics:
        rep.rules += 1
        u = urllib.parse.urlsplit(public)
        if f"{u.scheme}://{u.netloc}" not in origins:
            rep.error(where, f"ASBX_PUBLIC_URL {public} is not in ASBX_WORKSPACE_ORIGINS {sorted(origins)}")


SECRETS = {}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kubernetes-version", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--cli", help="crates/asbx/src/cli.rs, for the settings names")
    args = ap.parse_args()
    rep = Report()
    version = args.kubernetes_version

    env_names = None
    if args.cli and os.path.isfile(args.cli):
        with open(args.cli) as f:
            env_names = set(re.findall(r'env\s*=\s*"([A-Z0-9_]+)"', f.read())) | EXTRA_ENV
        for name in sorted(PENDING_ENV - env_names):
            rep.note(f"{name} is not in {args.cli} yet: accepted as pending")
        env_names |= PENDING_ENV
    else:
        rep.note("crates/asbx/src/cli.rs not found: settings names not checked")

    all_yaml = set()
    for dirpath, _, files in os.walk(args.root):
        all_yaml |= {os.path.realpath(os.path.join(dirpath, f)) for f in files if f.endswith((".yaml", ".yml"))}

    # Secrets template: validated on its own, and what the references resolve against.
    seen = set()
    for name in NOT_IN_KUSTOMIZE:
        path = os.path.join(args.root, name)
        seen.add(os.path.realpath(path))
        for d in load(path):
            validate_doc(rep, path, d, version)
            if d.get("kind") == "Secret":
                data = {**(d.get("data") or {}), **(d.get("stringData") or {})}
                SECRETS[(d["metadata"]["namespace"], d["metadata"]["name"])] = data

    kdirs = sorted({os.path.dirname(p) for p in all_yaml if os.path.basename(p) == "kustomization.yaml"})
    files_validated = set()
    for kdir in kdirs:
        docs = kustomize_docs(rep, kdir, version, seen)
        for src, d in docs:
            if src.endswith("(patched)"):
                continue
            if (src, name_of(d)) in files_validated:
                continue
            files_validated.add((src, name_of(d)))
            validate_doc(rep, src, d, version)
        check_rules(rep, kdir, docs, env_names)
    for orphan in sorted(all_yaml - seen):
        rep.error(orphan, "not listed in any kustomization.yaml")

    status = "OK" if rep.errors == 0 else "FAILED"
    print(f"validate: {status}: {len(all_yaml)} files, {rep.validated} resources valid against "
          f"Kubernetes {version} (strict), {rep.skipped} CRD resources skipped, "
          f"{rep.rules} rule checks, {rep.errors} errors")
    return 0 if rep.errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
