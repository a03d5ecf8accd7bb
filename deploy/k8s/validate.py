#!/usr/bin/env python3
"""Offline validator of qrl's deployment files (tests/integration/k8s_manifests.sh).

    validate.py [--k8s-version V] [--repo DIR] [--qrl-config PROGRAM=FILE]... [MANIFEST_DIR]

1. Every document of MANIFEST_DIR/*.yaml (default deploy/k8s) against a schema, with no
   cluster: Kubernetes kinds with the OpenAPI schemas the `kubernetes-validate` package
   (PyPI) ships for version V (strict: an unknown field is an error); the Strimzi kinds
   (kafka.strimzi.io/v1 Kafka, KafkaNodePool, KafkaTopic) with schemas/strimzi-v1.json.
2. References between them: ConfigMaps, Secrets, PVCs and volumes a pod uses exist;
   named ports of probes and Services exist; Service selectors match a pod template; the
   StatefulSet's serviceName is a headless Service; Strimzi resources name an existing
   Kafka; the four qrl topics exist with min.insync.replicas < replicas; every file is in
   kustomization.yaml.
3. The qrl YAML configs inside the ConfigMaps (key learner.yaml / rollout.yaml) and the
   files given with --qrl-config (PROGRAM = qrl-learner or qrl-rollout): every key is one
   of the program's config table (docs/config-PROGRAM.md, generated from --help-markdown)
   and its value has the key's type, range or choices; the Kafka bootstrap address is the
   Strimzi bootstrap Service of the Kafka defined here.

Prints one line per checked item and "N ok, N errors"; exit 0 when there are no errors.
"""
import argparse
import glob
import json
import os
import re
import sys

import yaml

try:
    import jsonschema
    import kubernetes_validate
except ImportError as e:  # the test installs them; say what is missing
    print(f"validate.py: {e}: pip install kubernetes-validate", file=sys.stderr)
    sys.exit(77)

QRL_TOPICS = ("qrl.prompts", "qrl.results", "qrl.trace", "qrl.dlq")
errors = []
oks = 0


def ok(what):
    global oks
    oks += 1
    print(f"ok    {what}")


def err(what, msg):
    errors.append(f"{what}: {msg}")
    print(f"ERROR {what}: {msg}")


def name_of(doc):
    return f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"


# ---- 1. schemas -----------------------------------------------------------------------------
def check_schema(doc, where, k8s_version, strimzi):
    what = f"{where} {name_of(doc)}"
    api = doc.get("apiVersion", "")
    if api.startswith("kafka.strimzi.io/"):
        schema = strimzi["kinds"].get(doc.get("kind"))
        if schema is None:
            return err(what, f"no schema for Strimzi kind {doc.get('kind')}")
        schema = dict(schema, definitions=strimzi["definitions"])
        problems = sorted(jsonschema.Draft7Validator(schema).iter_errors(doc), key=lambda e: list(e.path))
        if problems:
            for p in problems:
                err(what, f"{'.'.join(str(x) for x in p.path) or '(top)'}: {p.message}")
            return
        return ok(f"{what} (Strimzi v1 schema)")
    if doc.get("kind") == "Kustomization":
        return ok(f"{what} (checked with the references)")
    try:
        kubernetes_validate.validate(doc, k8s_version, strict=True)
    except kubernetes_validate.ValidationError as e:
        path = ".".join(str(x) for x in e.path) or "(top)"
        return err(what, f"{path}: {e.message}")
    except kubernetes_validate.SchemaNotFoundError as e:
        return err(what, f"no schema: {e}")
    ok(f"{what} (Kubernetes {k8s_version} schema, strict)")


# ---- 2. references ---------------------------------------------------------------------------
def pod_specs(docs):
    """(workload doc, pod template) for every workload."""
    for d in docs:
        if d.get("kind") in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            yield d, d["spec"]["template"]


def check_references(docs, files, manifest_dir):
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d.get("kind"), {})[(d.get("metadata") or {}).get("name")] = d
    have = lambda kind, name: name in by_kind.get(kind, {})
    for w, tmpl in pod_specs(docs):
        what = name_of(w)
        spec = tmpl["spec"]
        vols = {v["name"]: v for v in spec.get("volumes", [])}
        for vct in w["spec"].get("volumeClaimTemplates", []):
            vols[vct["metadata"]["name"]] = {"pvc-template": True}
        for v in vols.values():
            if "configMap" in v and not have("ConfigMap", v["configMap"]["name"]):
                err(what, f"volume {v['name']}: no ConfigMap {v['configMap']['name']}")
            if "secret" in v and not have("Secret", v["secret"]["secretName"]):
                err(what, f"volume {v['name']}: no Secret {v['secret']['secretName']}")
            if "persistentVolumeClaim" in v and not have("PersistentVolumeClaim", v["persistentVolumeClaim"]["claimName"]):
                err(what, f"volume {v['name']}: no PVC {v['persistentVolumeClaim']['claimName']}")
        labels = tmpl["metadata"].get("labels", {})
        sel = w["spec"]["selector"]["matchLabels"]
        if any(labels.get(k) != val for k, val in sel.items()):
            err(what, f"selector {sel} does not match the pod labels {labels}")
        for c in spec["containers"]:
            cw = f"{what} container {c['name']}"
            for m in c.get("volumeMounts", []):
                if m["name"] not in vols:
                    err(cw, f"mount {m['mountPath']}: no volume {m['name']}")
                v = vols.get(m["name"], {})
                if "subPath" in m and "configMap" in v:
                    cm = by_kind["ConfigMap"].get(v["configMap"]["name"], {})
                    if m["subPath"] not in cm.get("data", {}):
                        err(cw, f"mount {m['mountPath']}: ConfigMap {v['configMap']['name']} has no key {m['subPath']}")
            for ef in c.get("envFrom", []):
                if "configMapRef" in ef and not have("ConfigMap", ef["configMapRef"]["name"]):
                    err(cw, f"envFrom: no ConfigMap {ef['configMapRef']['name']}")
            ports = {p.get("name") for p in c.get("ports", [])}
            defined = {e["name"] for e in c.get("env", [])}
            for arg in c.get("args", []) + c.get("command", []):
                for ref in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", arg):
                    if ref not in defined:
                        err(cw, f"argument {arg!r} uses $({ref}), which is not in env")
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                p = c.get(probe) or {}
                for kind in ("httpGet", "tcpSocket", "grpc"):
                    port = (p.get(kind) or {}).get("port")
                    if isinstance(port, str) and port not in ports:
                        err(cw, f"{probe}: no container port named {port}")
            if any(r.startswith("nvidia.com/gpu") for r in (c.get("resources", {}).get("limits") or {})):
                ok(f"{cw}: GPU limit {c['resources']['limits']['nvidia.com/gpu']}")
            ok(f"{cw}: volumes, config, env and probe ports resolve")
        if w.get("kind") == "StatefulSet":
            svc = by_kind.get("Service", {}).get(w["spec"]["serviceName"])
            if not svc or svc["spec"].get("clusterIP") != "None":
                err(what, f"serviceName {w['spec']['serviceName']} is not a headless Service")
    for name, svc in by_kind.get("Service", {}).items():
        sel = svc["spec"].get("selector", {})
        targets = [(w, t) for w, t in pod_specs(docs)
                   if all(t["metadata"].get("labels", {}).get(k) == v for k, v in sel.items())]
        if not targets:
            err(f"Service/{name}", f"selector {sel} matches no pod template")
            continue
        ports = {p.get("name") for _, t in targets for c in t["spec"]["containers"] for p in c.get("ports", [])}
        for p in svc["spec"]["ports"]:
            if isinstance(p.get("targetPort"), str) and p["targetPort"] not in ports:
                err(f"Service/{name}", f"targetPort {p['targetPort']} is no container port")
        ok(f"Service/{name}: selects {', '.join(name_of(w) for w, _ in targets)}")
    kafkas = by_kind.get("Kafka", {})
    for kind in ("KafkaNodePool", "KafkaTopic"):
        for name, d in by_kind.get(kind, {}).items():
            c = d["metadata"].get("labels", {}).get("strimzi.io/cluster")
            if c not in kafkas:
                err(f"{kind}/{name}", f"strimzi.io/cluster {c} is no Kafka defined here")
    topics = by_kind.get("KafkaTopic", {})
    for t in QRL_TOPICS:
        d = topics.get(t)
        if not d:
            err("KafkaTopic", f"topic {t} missing")
            continue
        rf, isr = d["spec"].get("replicas", 1), int(d["spec"].get("config", {}).get("min.insync.replicas", 1))
        if not isr < rf:
            err(f"KafkaTopic/{t}", f"min.insync.replicas {isr} must be < replicas {rf} to survive a broker loss")
        else:
            ok(f"KafkaTopic/{t}: {d['spec'].get('partitions')} partitions, replicas {rf}, min.insync.replicas {isr}")
    kust = os.path.join(manifest_dir, "kustomization.yaml")
    if os.path.exists(kust):
        listed = set(yaml.safe_load(open(kust)).get("resources", []))
        present = {os.path.basename(f) for f in files} - {"kustomization.yaml"}
        for f in sorted(listed - present):
            err("kustomization.yaml", f"resource {f} does not exist")
        for f in sorted(present - listed):
            err("kustomization.yaml", f"{f} is not listed in resources")
        if listed == present:
            ok(f"kustomization.yaml lists every manifest ({len(listed)})")
    return by_kind


# ---- 3. qrl configs ---------------------------------------------------------------------------
def config_table(repo, program):
    """key -> (type, allowed) from docs/config-PROGRAM.md (generated by --help-markdown)."""
    table = {}
    path = os.path.join(repo, "docs", f"config-{program}.md")
    for line in open(path, encoding="utf-8"):
        m = re.match(r"^\| `([a-z0-9_.]+)` \| (\w+) \| [^|]* \| ([^|]*) \| (yes|no) \|", line)
        if m:
            table[m.group(1)] = (m.group(2), m.group(3).strip())
    if not table:
        raise SystemExit(f"validate.py: no config table in {path}")
    return table


def flatten(node, prefix=""):
    for k, v in node.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            yield from flatten(v, key + ".")
        else:
            yield key, v


def check_value(key, value, typ, allowed):
    if value is None:
        return "missing value (write '' for an empty string)"
    text = ("true" if value else "false") if isinstance(value, bool) else str(value)
    if typ == "bool":
        return None if text.lower() in ("true", "false", "yes", "no", "on", "off", "1", "0") else f"{text!r} is no bool"
    if typ == "enum":
        choices = re.findall(r"`([^`]*)`", allowed)
        return None if text in choices else f"{text!r} is not one of {', '.join(choices)}"
    if typ in ("int", "float"):
        try:
            num = int(text, 10) if typ == "int" else float(text)
        except ValueError:
            return f"{text!r} is no {typ}"
        m = re.match(r"^\[([^,]+), ([^\]]+)\]$", allowed)
        if m:
            lo, hi = float(m.group(1)), float(m.group(2))
            if not lo <= num <= hi:
                return f"{text} is outside [{m.group(1)}, {m.group(2)}]"
    if typ == "list" and isinstance(value, (list, dict)) and not all(not isinstance(x, (list, dict)) for x in value):
        return "a list of scalars is wanted"
    return None


def check_qrl_config(text, program, what, repo, bootstrap):
    if re.search(r"(^|\s)[&*][A-Za-z0-9_]", text):
        return err(what, "anchors/aliases are refused by qrl's config loader")
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as e:
        return err(what, f"YAML: {e}")
    if len(docs) != 1 or not isinstance(docs[0], dict):
        return err(what, "one YAML document with a mapping of sections is wanted")
    table = config_table(repo, program)
    n0 = len(errors)
    keys = list(flatten(docs[0]))
    for key, value in keys:
        if key not in table:
            near = [k for k in table if k.split(".")[-1] == key.split(".")[-1]]
            err(what, f"{key}: not a {program} key" + (f" (did you mean {near[0]}?)" if near else ""))
            continue
        why = check_value(key, value, *table[key])
        if why:
            err(what, f"{key}: {why}")
    values = dict(keys)
    if bootstrap and "kafka.bootstrap" in values and values["kafka.bootstrap"] != bootstrap:
        err(what, f"kafka.bootstrap {values['kafka.bootstrap']} is not the Strimzi bootstrap {bootstrap}")
    if len(errors) == n0:
        ok(f"{what}: {len(keys)} keys of {program} with valid values")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("manifests", nargs="?", default=None)
    ap.add_argument("--repo", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    ap.add_argument("--k8s-version", default="1.33.0")
    ap.add_argument("--qrl-config", action="append", default=[], metavar="PROGRAM=FILE")
    a = ap.parse_args()
    repo = os.path.abspath(a.repo)
    strimzi = json.load(open(os.path.join(repo, "deploy", "k8s", "schemas", "strimzi-v1.json")))
    bootstrap = None
    if a.manifests or not a.qrl_config:
        mdir = a.manifests or os.path.join(repo, "deploy", "k8s")
        files = sorted(glob.glob(os.path.join(mdir, "*.yaml")))
        docs = []
        for f in files:
            for i, d in enumerate(yaml.safe_load_all(open(f, encoding="utf-8"))):
                if d is None:
                    continue
                docs.append(d)
                check_schema(d, f"{os.path.basename(f)}#{i}", a.k8s_version, strimzi)
        by_kind = check_references(docs, files, mdir)
        for name, k in by_kind.get("Kafka", {}).items():
            plain = [l for l in k["spec"]["kafka"]["listeners"] if not l["tls"]]
            if plain:
                bootstrap = f"{name}-kafka-bootstrap.{k['metadata'].get('namespace', 'default')}.svc:{plain[0]['port']}"
        for name, cm in by_kind.get("ConfigMap", {}).items():
            for key, text in (cm.get("data") or {}).items():
                program = {"learner.yaml": "qrl-learner", "rollout.yaml": "qrl-rollout"}.get(key)
                if program:
                    check_qrl_config(text, program, f"ConfigMap/{name} {key}", repo, bootstrap)
    for spec in a.qrl_config:
        program, _, path = spec.partition("=")
        check_qrl_config(open(path, encoding="utf-8").read(), program, path, repo, None)
    print(f"{oks} ok, {len(errors)} errors")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
