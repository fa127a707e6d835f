#!/usr/bin/env python3
"""The deployment rules of issue 11, checked on the rendered manifests (offline).

scripts/check-deploy.sh renders every kustomization into one directory (file names are the
kustomization paths with `/` as `-`: overlays-dev.yaml, overlays-production-migrate.yaml, ...)
and runs this on it. Every failure names the environment, the object and the rule; the exit
status is 1 if any rule fails.

    check_rules.py --rendered DIR --routes deploy/routes.tsv \
        --nats-values deploy/k8s/infra/nats/values.yaml \
        --dockerfile deploy/Dockerfile --dockerignore .dockerignore
"""

import argparse
import json
import pathlib
import re
import sys
from urllib.parse import urlparse

import yaml

NAMESPACE = "switchboard"
ENVIRONMENTS = ("dev", "production")

# What each service is and may read. `deps`: the dependencies its /readyz checks one after the
# other, each bounded at 2 s (platform::http::readiness). `secrets`: every Secret it may read;
# `required`: those it cannot start without (production adds its NATS user and the NATS CA).
SERVICES = {
    "attachments": {
        "public": True,
        "deps": 3,
        "db": "SB_ATTACHMENTS_DATABASE_URL",
        "clients": {"nats", "postgres", "s3"},
        "secrets": {"switchboard-jwt", "switchboard-attachments-db", "switchboard-attachments-s3",
                    "switchboard-supabase", "switchboard-attachments-nats", "switchboard-nats-ca"},
        "required": {"switchboard-jwt", "switchboard-attachments-db", "switchboard-attachments-s3"},
    },
    "runs": {
        "public": True,
        "deps": 1,
        "db": None,
        "clients": {"nats"},
        "secrets": {"switchboard-jwt", "switchboard-runs-nats", "switchboard-nats-ca"},
        "required": {"switchboard-jwt"},
    },
    "history": {
        "public": True,
        "deps": 2,
        "db": "SB_HISTORY_DATABASE_URL",
        "clients": {"nats", "postgres"},
        "secrets": {"switchboard-jwt", "switchboard-history-db", "switchboard-history-nats",
                    "switchboard-nats-ca"},
        "required": {"switchboard-jwt", "switchboard-history-db"},
    },
    "worker": {
        "public": False,
        "deps": 1,
        "db": None,
        "clients": {"nats", "s3"},
        "secrets": {"switchboard-worker-s3", "switchboard-openai", "switchboard-worker-nats",
                    "switchboard-nats-ca"},
        "required": {"switchboard-worker-s3"},
    },
}
CLIENT_LABEL = "switchboard/{}-client"
PUBLIC_LABEL = "switchboard/public-http"
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}


class Report:
    def __init__(self):
        self.failures = []
        self.checks = 0

    def check(self, ok, where, rule, detail=""):
        self.checks += 1
        if not ok:
            self.failures.append(f"FAIL [{where}] {rule}" + (f": {detail}" if detail else ""))
        return ok


def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def name_of(obj):
    return obj["metadata"]["name"]


def ident(obj):
    return f"{obj['kind']}/{name_of(obj)}"


def by_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def find(docs, kind, name):
    for d in docs:
        if d["kind"] == kind and name_of(d) == name:
            return d
    return None


def quantity(value):
    """A Kubernetes quantity in bytes (memory) or cores (cpu)."""
    s = str(value)
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9,
             "T": 1e12, "m": 1e-3}
    for unit, factor in units.items():
        if s.endswith(unit):
            return float(s[: -len(unit)]) * factor
    return float(s)


def selects(selector, labels):
    """Whether a LabelSelector (matchLabels, matchExpressions) matches `labels`."""
    if selector is None:
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def pod_spec(obj):
    if obj["kind"] in ("Deployment", "StatefulSet", "Job", "DaemonSet"):
        return obj["spec"]["template"]["spec"]
    return None


def pod_labels(obj):
    return obj["spec"]["template"]["metadata"].get("labels") or {}


def containers(spec):
    return (spec.get("initContainers") or []) + spec["containers"]


def env_of(container):
    return {e["name"]: e.get("value") for e in container.get("env") or []}


def secret_refs(spec):
    """Secret name -> optional, for every Secret a pod reads (env, envFrom, volumes)."""
    refs = {}
    for c in containers(spec):
        for src in c.get("envFrom") or []:
            if "secretRef" in src:
                refs[src["secretRef"]["name"]] = bool(src["secretRef"].get("optional"))
        for e in c.get("env") or []:
            ref = (e.get("valueFrom") or {}).get("secretKeyRef")
            if ref:
                refs[ref["name"]] = bool(ref.get("optional"))
    for v in spec.get("volumes") or []:
        if "secret" in v:
            refs[v["secret"]["secretName"]] = bool(v["secret"].get("optional"))
        for src in (v.get("projected") or {}).get("sources") or []:
            if "secret" in src:
                refs[src["secret"]["name"]] = bool(src["secret"].get("optional"))
    return refs


def image_repo(image):
    """The image without its tag or digest."""
    image = image.split("@", 1)[0]
    head, _, last = image.rpartition("/")
    return (head + "/" if head else "") + last.split(":", 1)[0]


def image_ok(image):
    """An explicit version: a tag other than `latest`, or a digest."""
    if "@sha256:" in image:
        return True
    last = image.rsplit("/", 1)[-1]
    return ":" in last and last.rsplit(":", 1)[1] not in ("", "latest")


# ---------------------------------------------------------------- rules


def check_restricted(r, where, obj):
    """The `restricted` Pod Security Standard, plus a read-only root filesystem."""
    spec = pod_spec(obj)
    psc = spec.get("securityContext") or {}
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        r.check(not spec.get(field), where, f"restricted: no {field}")
    for v in spec.get("volumes") or []:
        kinds = set(v) - {"name"}
        r.check(kinds <= RESTRICTED_VOLUMES, where, "restricted: volume types",
                f"volume {v['name']} is {sorted(kinds)}")
    r.check(not psc.get("sysctls"), where, "restricted: no sysctls")
    for c in containers(spec):
        csc = c.get("securityContext") or {}
        cw = f"{where} container {c['name']}"
        r.check(csc.get("allowPrivilegeEscalation") is False, cw,
                "restricted: allowPrivilegeEscalation false")
        r.check(not csc.get("privileged"), cw, "restricted: not privileged")
        caps = csc.get("capabilities") or {}
        r.check("ALL" in (caps.get("drop") or []), cw, "restricted: capabilities.drop [ALL]")
        r.check(set(caps.get("add") or []) <= {"NET_BIND_SERVICE"}, cw,
                "restricted: no added capabilities but NET_BIND_SERVICE")
        run_as_non_root = csc.get("runAsNonRoot", psc.get("runAsNonRoot"))
        r.check(run_as_non_root is True, cw, "restricted: runAsNonRoot")
        r.check(csc.get("runAsUser", psc.get("runAsUser")) != 0, cw, "restricted: runAsUser not 0")
        seccomp = (csc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        r.check(seccomp == "RuntimeDefault", cw, "restricted: seccompProfile RuntimeDefault",
                f"got {seccomp}")
        r.check(csc.get("readOnlyRootFilesystem") is True, cw, "read-only root filesystem")
        r.check(not any(p.get("hostPort") for p in c.get("ports") or []), cw,
                "restricted: no hostPort")
        r.check(image_ok(c["image"]), cw, "image has a version tag or digest, never latest",
                c["image"])


def check_service_deployment(r, env, docs, svc, rules):
    where = f"{env} Deployment/switchboard-{svc}"
    dep = find(docs, "Deployment", f"switchboard-{svc}")
    if not r.check(dep is not None, where, "the service has a Deployment"):
        return None
    spec = pod_spec(dep)
    labels = pod_labels(dep)
    r.check(len(spec["containers"]) == 1, where, "one container")
    c = spec["containers"][0]
    env_vars = env_of(c)
    check_restricted(r, where, dep)

    # Port and address.
    ports = {p.get("name"): p["containerPort"] for p in c.get("ports") or []}
    r.check(ports.get("http") == 8080, where, "container port `http` is 8080", str(ports))
    addr_var = f"SB_{svc.upper()}_ADDR"
    r.check(env_vars.get(addr_var) == "0.0.0.0:8080", where, f"{addr_var}=0.0.0.0:8080",
            str(env_vars.get(addr_var)))

    # Probes on the real routes, timeouts that fit the checks.
    for probe, path in (("startupProbe", "/healthz"), ("readinessProbe", "/readyz"),
                        ("livenessProbe", "/healthz")):
        p = c.get(probe)
        if not r.check(p is not None, where, f"has a {probe}"):
            continue
        get = p.get("httpGet") or {}
        r.check(get.get("path") == path and get.get("port") in ("http", 8080), where,
                f"{probe} is GET {path} on the service port", str(get))
    ready = c.get("readinessProbe") or {}
    need = 2 * SERVICES[svc]["deps"]
    r.check(ready.get("timeoutSeconds", 1) > need, where,
            f"readiness timeout exceeds its {SERVICES[svc]['deps']} dependency check(s) x 2 s",
            f"timeoutSeconds {ready.get('timeoutSeconds', 1)} <= {need}")
    startup = c.get("startupProbe") or {}
    budget = startup.get("periodSeconds", 10) * startup.get("failureThreshold", 3)
    r.check(budget >= 60, where, "startup probe allows at least 60 s to connect and start",
            f"{budget} s")

    # Resources.
    res = c.get("resources") or {}
    req, lim = res.get("requests") or {}, res.get("limits") or {}
    r.check("cpu" in req and "memory" in req, where, "requests cpu and memory", str(req))
    if r.check("memory" in lim, where, "has a memory limit", str(lim)):
        r.check(quantity(lim["memory"]) >= quantity(req.get("memory", 0)), where,
                "memory limit >= request")
    if svc == "worker" and "memory" in lim:
        helpers = int(env_vars.get("SB_WORKER_EXTRACT_CONCURRENCY") or 2) * int(
            env_vars.get("SB_WORKER_EXTRACT_MEMORY_MIB") or 384)
        floor = (helpers + 512) * 2**20
        r.check(quantity(lim["memory"]) >= floor, where,
                "worker memory limit exceeds the extraction helpers' bound + 512 MiB",
                f"{lim['memory']} < {helpers + 512}Mi")

    # Its own ServiceAccount, without a token.
    sa_name = spec.get("serviceAccountName")
    r.check(sa_name == f"switchboard-{svc}", where, "runs as its own ServiceAccount", str(sa_name))
    sa = find(docs, "ServiceAccount", sa_name or "")
    if r.check(sa is not None, where, "its ServiceAccount exists", str(sa_name)):
        r.check(sa.get("automountServiceAccountToken") is False, f"{env} {ident(sa)}",
                "automountServiceAccountToken false")
    r.check(spec.get("automountServiceAccountToken") is False, where,
            "pod automountServiceAccountToken false")

    # Only the Secrets it uses.
    refs = secret_refs(spec)
    extra = set(refs) - SERVICES[svc]["secrets"]
    r.check(not extra, where, "reads only its own Secrets", f"also reads {sorted(extra)}")
    required = set(SERVICES[svc]["required"])
    if env == "production":
        required |= {f"switchboard-{svc}-nats", "switchboard-nats-ca"}
        if svc == "worker":
            required.add("switchboard-openai")
    for name in sorted(required):
        r.check(name in refs and not refs[name], where, f"reads Secret {name} (required)",
                "missing" if name not in refs else "marked optional")
    if SERVICES[svc]["db"]:
        r.check(env_vars.get("SB_DB_MIGRATE") == "false", where,
                "SB_DB_MIGRATE=false (the migrate Job migrates before the rollout)")

    # Drain: a preStop pause and a grace period that fits it.
    pre = ((c.get("lifecycle") or {}).get("preStop")) or {}
    pause = (pre.get("sleep") or {}).get("seconds")
    if pause is None and pre.get("exec"):
        pause = 0
    r.check(pause is not None and pause > 0, where, "has a preStop pause", str(pre))
    grace = spec.get("terminationGracePeriodSeconds", 30)
    if svc == "worker":
        drain = env_vars.get("SB_WORKER_DRAIN_SECS")
        if r.check(drain is not None, where, "states SB_WORKER_DRAIN_SECS"):
            r.check(grace > int(drain) + (pause or 0), where,
                    "terminationGracePeriodSeconds > SB_WORKER_DRAIN_SECS + preStop",
                    f"{grace} <= {drain} + {pause}")
    else:
        r.check(grace >= (pause or 0) + 20, where,
                "terminationGracePeriodSeconds >= preStop + 20 s of drain", f"{grace}")

    # Spread across nodes.
    spread = [t for t in spec.get("topologySpreadConstraints") or []
              if t.get("topologyKey") == "kubernetes.io/hostname"]
    r.check(any(selects(t.get("labelSelector"), labels) for t in spread), where,
            "topology spread across nodes (kubernetes.io/hostname) over its own pods")

    # A disruption budget.
    pdbs = [p for p in by_kind(docs, "PodDisruptionBudget") if selects(p["spec"].get("selector"), labels)]
    r.check(len(pdbs) == 1, where, "exactly one PodDisruptionBudget selects it",
            str([name_of(p) for p in pdbs]))

    # Network identity: the labels the infrastructure's policies admit.
    r.check((labels.get(PUBLIC_LABEL) == "true") == SERVICES[svc]["public"], where,
            f"{PUBLIC_LABEL} only on the services the Ingress routes to")
    for client in ("nats", "postgres", "s3"):
        want = client in SERVICES[svc]["clients"]
        r.check((labels.get(CLIENT_LABEL.format(client)) == "true") == want, where,
                f"{CLIENT_LABEL.format(client)} {'set' if want else 'absent'}")

    # Replicas: dev states 1; production leaves them to the autoscalers.
    if env == "dev":
        r.check(dep["spec"].get("replicas") == 1, where, "dev: one replica")
    else:
        r.check("replicas" not in dep["spec"], where,
                "production: no spec.replicas (the autoscaler owns it)")
    rules["deployments"][svc] = dep
    return dep


def check_ingress(r, env, docs, routes):
    ingresses = by_kind(docs, "Ingress")
    if not r.check(len(ingresses) == 1, f"{env} Ingress", "one Ingress, the one origin"):
        return
    ing = ingresses[0]
    where = f"{env} {ident(ing)}"
    ann = ing["metadata"].get("annotations") or {}
    prefix = "nginx.ingress.kubernetes.io/"
    r.check(ann.get(prefix + "proxy-buffering") == "off", where, "proxy-buffering off (SSE)")
    r.check(ann.get(prefix + "proxy-request-buffering") == "off", where,
            "proxy-request-buffering off (uploads streamed)")
    for t in ("proxy-read-timeout", "proxy-send-timeout"):
        r.check(int(ann.get(prefix + t, "0")) >= 3600, where, f"{t} >= 3600 s (streams)")
    body = ann.get(prefix + "proxy-body-size", "1m")
    r.check(quantity(body.replace("m", "M").replace("k", "k")) >= 100e6, where,
            "proxy-body-size >= 100 MB", body)
    rules = ing["spec"].get("rules") or []
    paths = [(rule.get("host"), p) for rule in rules for p in rule["http"]["paths"]]
    if env == "production":
        r.check("cert-manager.io/cluster-issuer" in ann, where, "TLS by cert-manager annotation")
        hosts = {h for h, _ in paths}
        tls_hosts = {h for t in ing["spec"].get("tls") or [] for h in t.get("hosts") or []}
        r.check(None not in hosts and hosts <= tls_hosts, where, "TLS covers every host",
                f"hosts {hosts}, tls {tls_hosts}")
    routed = {}
    for host, p in paths:
        routed.setdefault(p["path"], []).append(p)
    for match, path, service, _kind in routes:
        entries = routed.pop(path, [])
        if not r.check(len(entries) == 1, where, f"routes.tsv {path} is routed exactly once",
                       f"{len(entries)} entries"):
            continue
        p = entries[0]
        want = {"exact": "Exact", "prefix": "Prefix"}[match]
        r.check(p["pathType"] == want, where, f"{path}: pathType {want}", p["pathType"])
        backend = p["backend"]["service"]
        r.check(backend["name"] == f"switchboard-{service}", where,
                f"{path}: routed to switchboard-{service}", backend["name"])
        # Reaches a backend: the Service exists, its port targets the pods' http port.
        svc = find(docs, "Service", backend["name"])
        if not r.check(svc is not None, where, f"{path}: backend Service exists", backend["name"]):
            continue
        port = backend["port"]
        sport = [sp for sp in svc["spec"]["ports"]
                 if sp.get("name") == port.get("name") or sp["port"] == port.get("number")]
        if not r.check(len(sport) == 1, where, f"{path}: backend port exists on the Service",
                       str(port)):
            continue
        dep = next((d for d in by_kind(docs, "Deployment")
                    if selects({"matchLabels": svc["spec"]["selector"]}, pod_labels(d))), None)
        if not r.check(dep is not None, where, f"{path}: the Service selects a Deployment's pods"):
            continue
        target = sport[0].get("targetPort", sport[0]["port"])
        cports = [cp for c in pod_spec(dep)["containers"] for cp in c.get("ports") or []]
        r.check(any(cp.get("name") == target or cp["containerPort"] == target for cp in cports),
                where, f"{path}: the Service's targetPort is a container port", str(target))
    r.check(not routed, where, "nothing routed that deploy/routes.tsv does not list",
            str(sorted(routed)))


def peers_only(rule_from, allowed):
    """Every `from` peer satisfies one of the `allowed` predicates."""
    return bool(rule_from) and all(any(ok(peer) for ok in allowed) for peer in rule_from)


def namespace_is(peer, names):
    ns = (peer.get("namespaceSelector") or {}).get("matchLabels") or {}
    return ns.get("kubernetes.io/metadata.name") in names


def check_network_policies(r, env, docs, nats_docs, rules):
    policies = by_kind(docs, "NetworkPolicy")
    deny = [p for p in policies if p["spec"].get("podSelector") == {}
            and p["spec"].get("policyTypes") == ["Ingress"] and not p["spec"].get("ingress")]
    r.check(bool(deny), f"{env} NetworkPolicy", "a default deny of ingress in the namespace")
    for svc, dep in rules["deployments"].items():
        labels = pod_labels(dep)
        where = f"{env} Deployment/switchboard-{svc}"
        rules_in = [rule for p in policies if selects(p["spec"]["podSelector"], labels)
                    for rule in p["spec"].get("ingress") or []]
        sources = set()
        for rule in rules_in:
            for peer in rule.get("from") or [{}]:
                ns = ((peer.get("namespaceSelector") or {}).get("matchLabels") or {}).get(
                    "kubernetes.io/metadata.name")
                sources.add(ns or "<any>")
        allowed = {"monitoring"} | ({"ingress-nginx"} if SERVICES[svc]["public"] else set())
        r.check(sources <= allowed, where,
                "reachable only from the ingress controller (HTTP services) and Prometheus",
                f"admitted from {sorted(sources)}")
        if SERVICES[svc]["public"]:
            r.check("ingress-nginx" in sources, where, "the ingress controller may reach it")

    # Production: every service's egress is restricted, and nothing may reach the instance
    # metadata address.
    if env != "dev":
        egress = [p for p in policies if "Egress" in (p["spec"].get("policyTypes") or [])]
        for svc, dep in rules["deployments"].items():
            labels = pod_labels(dep)
            where = f"{env} Deployment/switchboard-{svc}"
            mine = [p for p in egress if selects(p["spec"]["podSelector"], labels)]
            r.check(bool(mine), where, "production: its egress is restricted by a NetworkPolicy")
            for p in mine:
                for rule in p["spec"].get("egress") or []:
                    for peer in rule.get("to") or [{}]:
                        block = peer.get("ipBlock")
                        if peer == {} or (block and block.get("cidr") == "0.0.0.0/0"
                                          and "169.254.0.0/16" not in (block.get("except") or [])):
                            r.check(False, where, "egress never reaches 169.254.169.254 (instance metadata)",
                                   str(peer))

    # NATS and PostgreSQL admit only the services on their client ports.
    def client_peer(kind):
        def ok(peer):
            pod = (peer.get("podSelector") or {}).get("matchLabels") or {}
            return pod.get(CLIENT_LABEL.format(kind)) == "true" and (
                "namespaceSelector" not in peer or namespace_is(peer, {NAMESPACE}))
        return ok

    def cnpg_internal(peer):
        pod = (peer.get("podSelector") or {}).get("matchLabels") or {}
        return ("cnpg.io/cluster" in pod and "namespaceSelector" not in peer) or (
            namespace_is(peer, {"cnpg-system"}) and "podSelector" not in peer)

    targets = [("nats", nats_docs, {"app.kubernetes.io/name": "nats"}, 4222, [client_peer("nats")])]
    if env == "dev":
        targets.append(("postgres", docs, {"app.kubernetes.io/name": "switchboard-postgres"}, 5432,
                        [client_peer("postgres")]))
    else:
        targets.append(("postgres", docs, {"cnpg.io/cluster": "switchboard-pg"}, 5432,
                        [client_peer("postgres"), cnpg_internal]))
    for kind, bundle, labels, port, allowed in targets:
        pols = [p for p in by_kind(bundle, "NetworkPolicy") if selects(p["spec"]["podSelector"], labels)]
        where = f"{env} NetworkPolicy ({kind})"
        r.check(any(p["spec"].get("podSelector") == {} and not p["spec"].get("ingress") for p in pols),
                where, f"{kind}: ingress denied by default")
        port_rules = [rule for p in pols for rule in p["spec"].get("ingress") or []
                      if any(pp.get("port") == port for pp in rule.get("ports") or [])
                      or not rule.get("ports")]
        r.check(bool(port_rules), where, f"{kind}: the services are admitted on {port}")
        for rule in port_rules:
            r.check(peers_only(rule.get("from"), allowed), where,
                    f"{kind}: only the services reach port {port}", str(rule.get("from")))


def check_autoscaling(r, env, docs, rules, config):
    hpas = by_kind(docs, "HorizontalPodAutoscaler")
    scaled = by_kind(docs, "ScaledObject")
    if env == "dev":
        r.check(not hpas and not scaled, f"{env}", "dev: no autoscalers (one replica each)")
        return
    for svc in ("runs", "history", "attachments"):
        where = f"{env} HorizontalPodAutoscaler for switchboard-{svc}"
        mine = [h for h in hpas if h["spec"]["scaleTargetRef"] ==
                {"apiVersion": "apps/v1", "kind": "Deployment", "name": f"switchboard-{svc}"}]
        if not r.check(len(mine) == 1, where, "one HPA targets the Deployment"):
            continue
        h = mine[0]
        r.check(any(m.get("type") == "Resource" and m["resource"]["name"] == "cpu"
                    for m in h["spec"].get("metrics") or []), where, "scales on CPU")
        r.check(h["spec"].get("minReplicas", 1) >= 2, where, "production: at least 2 replicas")
        dep = rules["deployments"].get(svc)
        pdb = next((p for p in by_kind(docs, "PodDisruptionBudget")
                    if dep and selects(p["spec"].get("selector"), pod_labels(dep))), None)
        if pdb and "minAvailable" in pdb["spec"]:
            r.check(int(pdb["spec"]["minAvailable"]) < h["spec"].get("minReplicas", 1), where,
                    "PDB minAvailable < minReplicas (a node can still be drained)")
    where = f"{env} worker autoscaling"
    r.check(not any(h["spec"]["scaleTargetRef"]["name"] == "switchboard-worker" for h in hpas),
            where, "the worker is not scaled by a CPU HPA")
    mine = [s for s in scaled if s["spec"]["scaleTargetRef"]["name"] == "switchboard-worker"]
    if not r.check(len(mine) == 1, where, "one KEDA ScaledObject targets the worker"):
        return
    triggers = mine[0]["spec"]["triggers"]
    r.check([t["type"] for t in triggers] == ["nats-jetstream"], where,
            "scaled on JetStream consumer lag only (nats-jetstream trigger)")
    meta = triggers[0]["metadata"]
    prefix = config.get("SB_NATS_PREFIX", "sb")
    stream = prefix.upper().replace("-", "_") + "_RUNS"
    r.check(meta.get("stream") == stream, where, f"stream {stream} (protocol Names::runs_stream)",
            str(meta.get("stream")))
    r.check(meta.get("consumer") == "worker", where, "consumer `worker` (protocol WORKER_CONSUMER)")
    for key in ("natsServerMonitoringEndpoint", "account", "lagThreshold"):
        r.check(bool(meta.get(key)), where, f"trigger sets {key}")
    worker = rules["deployments"].get("worker")
    if worker:
        concurrency = env_of(pod_spec(worker)["containers"][0]).get("SB_WORKER_CONCURRENCY", "16")
        r.check(meta.get("lagThreshold") == concurrency, where,
                "lagThreshold = one replica's SB_WORKER_CONCURRENCY", f"{meta.get('lagThreshold')}")


def check_monitoring(r, env, docs):
    if env == "dev":
        return
    monitors = by_kind(docs, "ServiceMonitor")
    for svc in SERVICES:
        service = find(docs, "Service", f"switchboard-{svc}")
        where = f"{env} ServiceMonitor for switchboard-{svc}"
        if not r.check(service is not None, where, "the Service exists"):
            continue
        mine = [m for m in monitors if selects(m["spec"]["selector"], service["metadata"].get("labels") or {})]
        if not r.check(len(mine) == 1, where, "one ServiceMonitor selects the Service"):
            continue
        names = {p.get("name") for p in service["spec"]["ports"]}
        r.check(all(e.get("port") in names and e.get("path") == "/metrics"
                    for e in mine[0]["spec"]["endpoints"]), where, "scrapes /metrics on a Service port")
    # The alerts and the Grafana dashboard (a ConfigMap the Grafana sidecar picks up by label).
    r.check(len(by_kind(docs, "PrometheusRule")) == 1, f"{env} PrometheusRule", "the alerts exist")
    dashboard = find(docs, "ConfigMap", "switchboard-grafana-dashboard")
    where = f"{env} ConfigMap/switchboard-grafana-dashboard"
    if r.check(dashboard is not None, where, "the dashboard exists"):
        r.check((dashboard["metadata"].get("labels") or {}).get("grafana_dashboard") == "1", where,
                'labelled grafana_dashboard: "1" (the Grafana sidecar)')
        try:
            model = json.loads((dashboard.get("data") or {}).get("switchboard.json", ""))
        except ValueError as err:
            model = {"error": str(err)}
        r.check(bool(model.get("panels")), where, "switchboard.json is a dashboard with panels",
                str(model.get("error", "")))


def config_of(docs):
    maps = [c for c in by_kind(docs, "ConfigMap") if re.fullmatch(r"switchboard(-[a-z0-9]{10})?", name_of(c))]
    return maps[0].get("data") or {} if len(maps) == 1 else {}


def check_config(r, env, docs, config, rules):
    where = f"{env} ConfigMap/switchboard"
    r.check(bool(config), where, "the services' ConfigMap exists")
    for svc, dep in rules["deployments"].items():
        refs = [s["configMapRef"]["name"] for s in pod_spec(dep)["containers"][0].get("envFrom") or []
                if "configMapRef" in s]
        r.check(any(re.fullmatch(r"switchboard(-[a-z0-9]{10})?", n) for n in refs),
                f"{env} Deployment/switchboard-{svc}", "reads the ConfigMap switchboard")
    if env != "production":
        return
    r.check(config.get("SB_ENV") == "production", where, "SB_ENV=production")
    for key in ("SB_JWT_ISSUER", "SB_JWT_AUDIENCE", "SB_S3_PUBLIC_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT",
                "SB_NATS_TLS_CA_FILE"):
        r.check(bool(config.get(key)), where, f"sets {key}")
    r.check(config.get("SB_NATS_REPLICAS") == "3", where, "SB_NATS_REPLICAS=3 (3-node cluster)")
    r.check(config.get("SB_NATS_TLS_REQUIRED") == "true", where, "SB_NATS_TLS_REQUIRED=true")
    url = urlparse(config.get("SB_ATTACHMENTS_PUBLIC_URL", ""))
    r.check(url.scheme == "https" and bool(url.hostname), where,
            "SB_ATTACHMENTS_PUBLIC_URL is the https public origin")
    ing = by_kind(docs, "Ingress")
    if ing:
        hosts = {rule.get("host") for rule in ing[0]["spec"].get("rules") or []}
        r.check(hosts == {url.hostname}, where, "the Ingress host is SB_ATTACHMENTS_PUBLIC_URL's",
                f"{hosts} vs {url.hostname}")
    ca = config.get("SB_NATS_TLS_CA_FILE", "")
    for svc, dep in rules["deployments"].items():
        spec = pod_spec(dep)
        vols = {v["name"]: v for v in spec.get("volumes") or []}
        mounted = [m for m in spec["containers"][0].get("volumeMounts") or []
                   if ca.startswith(m["mountPath"].rstrip("/") + "/")
                   and (vols.get(m["name"], {}).get("secret") or {}).get("secretName") == "switchboard-nats-ca"]
        r.check(bool(mounted), f"{env} Deployment/switchboard-{svc}",
                "SB_NATS_TLS_CA_FILE is mounted from the Secret switchboard-nats-ca")


def check_migrate(r, env, migrate_docs, rules):
    jobs = by_kind(migrate_docs, "Job")
    for svc, spec_ in SERVICES.items():
        if not spec_["db"]:
            continue
        where = f"{env} migrate Job for {svc}"
        mine = [j for j in jobs
                if image_repo(pod_spec(j)["containers"][0]["image"]).endswith(f"switchboard-{svc}")]
        if not r.check(len(mine) == 1, where, "one migrate Job per service schema"):
            continue
        job = mine[0]
        check_restricted(r, f"{env} {ident(job)}", job)
        c = pod_spec(job)["containers"][0]
        r.check(c.get("args") == ["migrate"], where, "runs `<binary> migrate`", str(c.get("args")))
        r.check(pod_spec(job).get("restartPolicy") == "Never", where, "restartPolicy Never")
        r.check(job["metadata"]["namespace"] == NAMESPACE, where, f"namespace {NAMESPACE}")
        r.check(pod_labels(job).get(CLIENT_LABEL.format("postgres")) == "true", where,
                "admitted to PostgreSQL (client label)")
        r.check(pod_spec(job).get("automountServiceAccountToken") is False, where, "no token")
        dep = rules["deployments"].get(svc)
        if dep:
            dc = pod_spec(dep)["containers"][0]
            r.check(c["image"] == dc["image"], where, "the same image as the Deployment it precedes",
                    f"{c['image']} vs {dc['image']}")
            db_secret = f"switchboard-{svc}-db"
            r.check(db_secret in secret_refs(pod_spec(job)) and set(secret_refs(pod_spec(job))) == {db_secret},
                    where, f"reads only {db_secret}", str(sorted(secret_refs(pod_spec(job)))))


def check_nats_setup(r, env, migrate_docs, config):
    """The nats-setup Job makes the streams with the services' own NATS settings, as the admin,
    over the services' TLS: one ConfigMap value that differs would make streams the services do
    not expect (their users may not change them)."""
    where = f"{env} migrate Job switchboard-nats-setup"
    job = find(migrate_docs, "Job", "switchboard-nats-setup")
    if not r.check(job is not None, where, "exists"):
        return
    check_restricted(r, where, job)
    c = pod_spec(job)["containers"][0]
    r.check(c.get("args") == ["nats-setup"], where, "runs `<binary> nats-setup`", str(c.get("args")))
    r.check(pod_labels(job).get(CLIENT_LABEL.format("nats")) == "true", where,
            "admitted to NATS (client label)")
    secrets = set(secret_refs(pod_spec(job))) - {"switchboard-nats-ca"}
    r.check(secrets == {"switchboard-nats-admin"}, where,
            "reads no Secret but switchboard-nats-admin (and the CA)", str(sorted(secrets)))
    maps = [m for m in by_kind(migrate_docs, "ConfigMap")
            if re.fullmatch(r"switchboard-nats-setup(-[a-z0-9]{10})?", name_of(m))]
    if not r.check(len(maps) == 1, where, "its ConfigMap switchboard-nats-setup"):
        return
    setup = maps[0].get("data") or {}
    for key in sorted(k for k in set(config) | set(setup) if k.startswith("SB_NATS_") or k == "SB_ENV"):
        r.check(setup.get(key) == config.get(key), where, f"{key} as the services have it",
                f"{setup.get(key)!r} vs {config.get(key)!r}")
    ca = setup.get("SB_NATS_TLS_CA_FILE")
    if ca:
        spec = pod_spec(job)
        vols = {v["name"]: v for v in spec.get("volumes") or []}
        mounted = [m for m in c.get("volumeMounts") or []
                   if ca.startswith(m["mountPath"].rstrip("/") + "/")
                   and (vols.get(m["name"], {}).get("secret") or {}).get("secretName") == "switchboard-nats-ca"]
        r.check(bool(mounted), where, "SB_NATS_TLS_CA_FILE is mounted from the Secret switchboard-nats-ca")


def check_all_pods(r, env, docs):
    """Every pod template of a bundle (the services, the dev infrastructure, the Jobs)."""
    for obj in docs:
        if pod_spec(obj) is not None:
            check_restricted(r, f"{env} {ident(obj)} (every pod)", obj)
            r.check(pod_spec(obj).get("automountServiceAccountToken") is False,
                    f"{env} {ident(obj)}", "automountServiceAccountToken false")
        if obj["kind"] == "Cluster":
            r.check(image_ok(obj["spec"].get("imageName", "")), f"{env} {ident(obj)}",
                    "PostgreSQL image has a version tag", obj["spec"].get("imageName", "(operator default)"))


def check_namespace(r, env, docs):
    for obj in docs:
        if obj["kind"] == "Namespace":
            labels = obj["metadata"].get("labels") or {}
            r.check(labels.get("pod-security.kubernetes.io/enforce") == "restricted",
                    f"{env} {ident(obj)}", "enforces the restricted Pod Security Standard")
        else:
            r.check(obj["metadata"].get("namespace") == NAMESPACE, f"{env} {ident(obj)}",
                    f"in namespace {NAMESPACE}", str(obj["metadata"].get("namespace")))


def check_image_build(r, dockerfile, dockerignore):
    """deploy/Dockerfile: pinned bases, dependency caching, a non-root final image."""
    where = "deploy/Dockerfile"
    text = pathlib.Path(dockerfile).read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.M))
    bases = [args.get(m.strip("${}"), m) for m in re.findall(r"^FROM (\S+)", text, re.M)]
    r.check(len(bases) >= 2, where, "a build stage and a separate final image")
    for base in bases:
        r.check(image_ok(base), where, "base image pinned to a version tag or digest", base)
    r.check("--mount=type=cache" in text or "cargo chef" in text, where,
            "dependency caching (BuildKit cache mounts or cargo-chef)")
    final = text[text.rfind("\nFROM "):]
    user = re.findall(r"^USER (\S+)", final, re.M)
    r.check(bool(user) and user[-1].split(":")[0] not in ("0", "root"), where,
            "the final image runs as a non-root user", str(user))
    r.check("/usr/local/bin/switchboard-extract" in final, where,
            "the extraction helper is in every image")
    ignored = {line.strip().rstrip("/") for line in pathlib.Path(dockerignore).read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    for entry in ("target", ".data", ".git", "fuzz/corpus"):
        r.check(entry in ignored, ".dockerignore", f"excludes {entry}")
    r.check(any("node_modules" in e for e in ignored), ".dockerignore", "excludes node_modules")


def read_routes(path):
    routes = []
    for line in pathlib.Path(path).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        cols = line.split()
        if len(cols) != 4 or cols[0] not in ("exact", "prefix") or cols[2] not in SERVICES:
            raise ValueError(f"{path}: cannot read {line!r}")
        routes.append(tuple(cols))
    if not routes:
        raise ValueError(f"{path}: no routes")
    return routes


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rendered", required=True)
    parser.add_argument("--routes", required=True)
    parser.add_argument("--nats-values", required=True)
    parser.add_argument("--dockerfile", required=True)
    parser.add_argument("--dockerignore", required=True)
    args = parser.parse_args()
    rendered = pathlib.Path(args.rendered)
    routes = read_routes(args.routes)
    r = Report()

    nats_docs = load(rendered / "infra-nats.yaml")
    for env in ENVIRONMENTS:
        docs = load(rendered / f"overlays-{env}.yaml")
        migrate_docs = load(rendered / f"overlays-{env}-migrate.yaml")
        rules = {"deployments": {}}
        config = config_of(docs)
        deployments = {name_of(d) for d in by_kind(docs, "Deployment")}
        r.check(deployments == {f"switchboard-{s}" for s in SERVICES}, f"{env}",
                "exactly the four service Deployments", str(sorted(deployments)))
        for svc in SERVICES:
            check_service_deployment(r, env, docs, svc, rules)
        check_ingress(r, env, docs, routes)
        check_network_policies(r, env, docs, nats_docs if env == "production" else docs, rules)
        check_autoscaling(r, env, docs, rules, config)
        check_monitoring(r, env, docs)
        check_config(r, env, docs, config, rules)
        check_migrate(r, env, migrate_docs, rules)
        check_nats_setup(r, env, migrate_docs, config)
        check_all_pods(r, env, docs)
        check_namespace(r, env, docs)
        check_namespace(r, f"{env} migrate", migrate_docs)
        # Pods that carry a client label are exactly the ones that need it.
        for obj in docs + migrate_docs:
            if pod_spec(obj) is None or not name_of(obj).startswith("switchboard-"):
                continue
            if obj["kind"] == "StatefulSet":
                continue
            labels = pod_labels(obj)
            uses_db = any(n.endswith("-db") for n in secret_refs(pod_spec(obj)))
            r.check((labels.get(CLIENT_LABEL.format("postgres")) == "true") == uses_db,
                    f"{env} {ident(obj)}", "postgres client label iff it reads a database Secret")

    values = yaml.safe_load(pathlib.Path(args.nats_values).read_text())
    tag = ((values.get("container") or {}).get("image") or {}).get("tag", "")
    r.check(bool(tag) and tag != "latest", "infra/nats values.yaml", "NATS image has a version tag", tag)
    r.check(values["config"]["cluster"]["replicas"] == 3 and values["config"]["cluster"]["enabled"],
            "infra/nats values.yaml", "a 3-node cluster")
    js = values["config"]["jetstream"]
    r.check(js["enabled"] and js["fileStore"]["enabled"] and js["fileStore"]["pvc"]["enabled"],
            "infra/nats values.yaml", "JetStream with file storage on volumes")
    check_all_pods(r, "nats", nats_docs)
    check_image_build(r, args.dockerfile, args.dockerignore)

    for line in r.failures:
        print(line)
    if r.failures:
        print(f"rules: {len(r.failures)} of {r.checks} checks failed")
        return 1
    print(f"rules: {r.checks} checks passed ({', '.join(ENVIRONMENTS)}; {len(routes)} routes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
