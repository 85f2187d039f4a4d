"""Renders every kustomize overlay of deploy/kubernetes and checks it.

1. `kubectl kustomize` renders base and every overlay.
2. Every resource validates against the Kubernetes schemas (PyPI's
   kubernetes-validate, strict: an unknown field fails), and every
   LeaderWorkerSet against LWS's published CRD schema (vendored in
   deploy/kubernetes/schemas, made strict the same way).
3. Every pod template agrees with itself and with the binaries:
   - every Secret, ConfigMap (and key) and claim a pod uses is defined,
     and every mount names a volume of the pod;
   - every container runs what the image holds (coordinator, worker,
     tessera, etcd) with flags and environment the binaries accept: the
     init containers' `tessera certs init` runs for real against the
     rendered CA Secret, then `coordinator --check-config` and
     `worker ... --check-config` load the rendered configuration files,
     certificates and tokens, with paths mapped onto a scratch folder;
   - every environment variable is used: read by the binary (TESSERA_*,
     which --check-config refuses when unknown) or by a $(VAR) expansion;
   - ports agree: what the binaries listen on is a declared containerPort
     (QUIC on UDP), every probe's and Service's port is one, and every
     Service selects a pod that declares it;
   - the memory the planner may use is below the container's limit;
   - an LWS group's worker names are the ones its model's devices list.

Usage: k8s_check.py DEPLOY_DIR BIN_DIR
(DEPLOY_DIR: a copy of deploy/kubernetes whose components/secrets holds
ca.pem, ca.key and tokens.txt; BIN_DIR: where coordinator, worker, tessera
are.)
"""

import base64
import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib

import jsonschema
import kubernetes_validate
import yaml

KUBERNETES = "1.30.0"
NAMESPACE = "default"
POD_IP = "10.1.2.3"
# Variables a container may get that no Tessera binary reads.
OUTSIDE = {"RUST_LOG": "tracing's filter", "NVIDIA_DRIVER_CAPABILITIES": "the NVIDIA container toolkit"}
LWS_ENV = ("LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX")


def render(deploy, overlay):
    out = subprocess.run(["kubectl", "kustomize", os.path.join(deploy, overlay)],
                         capture_output=True, text=True)
    assert out.returncode == 0, f"kubectl kustomize {overlay}: {out.stderr}"
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def strict(schema):
    """The CRD schema with unknown fields refused, as the API server's
    pruning would drop them silently."""
    if isinstance(schema, dict):
        schema = {k: strict(v) for k, v in schema.items()}
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def validate(docs, lws_schema, where):
    for doc in docs:
        what = f"{where}: {doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] == "LeaderWorkerSet":
            assert doc["apiVersion"] == "leaderworkerset.x-k8s.io/v1", what
            try:
                jsonschema.validate(doc, lws_schema)
            except jsonschema.ValidationError as e:
                raise AssertionError(f"{what}: {e.message} at {list(e.absolute_path)}") from None
            # Its pod templates against Kubernetes' own schema too.
            for role in ("leaderTemplate", "workerTemplate"):
                template = doc["spec"]["leaderWorkerTemplate"][role]
                pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                       "spec": template["spec"]}
                kubernetes_validate.validate(pod, KUBERNETES, strict=True)
        else:
            try:
                kubernetes_validate.validate(doc, KUBERNETES, strict=True)
            except kubernetes_validate.ValidationError as e:
                raise AssertionError(f"{what}: {e}") from None


def pod_templates(docs):
    """(workload, pod name, labels, pod spec, extra env) per pod kind."""
    for doc in docs:
        name = doc["metadata"]["name"]
        if doc["kind"] == "StatefulSet":
            t = doc["spec"]["template"]
            claims = [c["metadata"]["name"] for c in doc["spec"].get("volumeClaimTemplates", [])]
            yield doc, f"{name}-0", t["metadata"].get("labels", {}), t["spec"], {}, claims
        elif doc["kind"] == "Deployment":
            t = doc["spec"]["template"]
            yield doc, f"{name}-5d9c7f8b6-x2x9q", t["metadata"].get("labels", {}), t["spec"], {}, []
        elif doc["kind"] == "LeaderWorkerSet":
            lwt = doc["spec"]["leaderWorkerTemplate"]
            size = lwt["size"]
            for index in range(size):
                role = "leaderTemplate" if index == 0 else "workerTemplate"
                t = lwt[role]
                labels = dict(t["metadata"].get("labels", {}))
                labels["leaderworkerset.sigs.k8s.io/name"] = name
                env = {"LWS_LEADER_ADDRESS": f"{name}-0.{name}.{NAMESPACE}",
                       "LWS_GROUP_SIZE": str(size), "LWS_WORKER_INDEX": str(index)}
                pod = f"{name}-0" if index == 0 else f"{name}-0-{index}"
                yield doc, pod, labels, t["spec"], env, []


def quantity_bytes(text):
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "k": 1000, "M": 10**6, "G": 10**9}
    m = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(text))
    assert m and (m.group(2) in units or not m.group(2)), f"quantity {text}"
    return int(float(m.group(1)) * units.get(m.group(2), 1))


def expand(text, env):
    """Kubernetes' $(VAR) expansion ($$ escapes); records what it used."""
    def sub(m):
        if m.group(0) == "$$":
            return "$"
        env["__used__"].add(m.group(1))
        return env[m.group(1)] if m.group(1) in env else m.group(0)
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, text)


class Pod:
    """One pod of a rendered template, its volumes made real under a
    scratch folder."""

    def __init__(self, docs, workload, pod_name, spec, extra_env, claims, scratch):
        self.docs, self.workload, self.name, self.spec = docs, workload, pod_name, spec
        self.extra_env, self.root = extra_env, scratch
        self.where = f"{workload['kind']}/{workload['metadata']['name']} pod {pod_name}"
        self.volumes = {}
        for v in spec.get("volumes", []):
            self.volumes[v["name"]] = self.make_volume(v)
        for c in claims:
            self.volumes[c] = self.fresh_dir(c)

    def find(self, kind, name):
        found = [d for d in self.docs if d["kind"] == kind and d["metadata"]["name"] == name]
        assert found, f"{self.where}: uses {kind} '{name}', which the overlay does not define"
        return found[0]

    def fresh_dir(self, name):
        path = os.path.join(self.root, "volumes", name)
        os.makedirs(path, exist_ok=True)
        return path

    def make_volume(self, v):
        path = self.fresh_dir(v["name"])
        if "secret" in v:
            data = self.find("Secret", v["secret"]["secretName"]).get("data", {})
            files = {k: base64.b64decode(x) for k, x in data.items()}
        elif "configMap" in v:
            files = {k: x.encode() for k, x in self.find("ConfigMap", v["configMap"]["name"]).get("data", {}).items()}
        elif "persistentVolumeClaim" in v:
            self.find("PersistentVolumeClaim", v["persistentVolumeClaim"]["claimName"])
            files = {}
        elif "emptyDir" in v:
            files = {}
        else:
            raise AssertionError(f"{self.where}: volume {v['name']}: an unexpected kind {sorted(v)}")
        for key, content in files.items():
            with open(os.path.join(path, key), "wb") as f:
                f.write(content)
        return path

    def env_of(self, container):
        """The container's environment with the downward API and config
        maps resolved, in order (later entries may use earlier ones)."""
        env = {"__used__": set(), **self.extra_env}
        for e in container.get("env", []):
            if "value" in e:
                env[e["name"]] = expand(e["value"], env)
                continue
            src = e["valueFrom"]
            if "fieldRef" in src:
                field = src["fieldRef"]["fieldPath"]
                env[e["name"]] = {"metadata.name": self.name, "metadata.namespace": NAMESPACE,
                                  "status.podIP": POD_IP}[field]
            elif "resourceFieldRef" in src:
                ref = src["resourceFieldRef"]
                target = [c for c in self.spec["containers"] if c["name"] == ref.get("containerName", container["name"])]
                assert target, f"{self.where}: resourceFieldRef names no container"
                kind, resource = ref["resource"].split(".", 1)
                amount = target[0].get("resources", {}).get(kind, {}).get(resource)
                assert amount, f"{self.where}: {e['name']} reads {ref['resource']}, which is not set"
                env[e["name"]] = str(quantity_bytes(amount) // quantity_bytes(ref.get("divisor", "1")))
            elif "configMapKeyRef" in src:
                ref = src["configMapKeyRef"]
                data = self.find("ConfigMap", ref["name"]).get("data", {})
                assert ref["key"] in data, f"{self.where}: ConfigMap {ref['name']} has no key {ref['key']}"
                env[e["name"]] = data[ref["key"]]
            elif "secretKeyRef" in src:
                ref = src["secretKeyRef"]
                data = self.find("Secret", ref["name"]).get("data", {})
                assert ref["key"] in data, f"{self.where}: Secret {ref['name']} has no key {ref['key']}"
                env[e["name"]] = base64.b64decode(data[ref["key"]]).decode()
            else:
                raise AssertionError(f"{self.where}: {e['name']}: an unexpected source {sorted(src)}")
        return env

    def mounts_of(self, container):
        """Mount path -> where it is here, longest first."""
        mounts = {}
        for m in container.get("volumeMounts", []):
            assert m["name"] in self.volumes, f"{self.where}: {container['name']} mounts an undefined volume {m['name']}"
            source = self.volumes[m["name"]]
            if "subPath" in m:
                source = os.path.join(source, m["subPath"])
                assert os.path.exists(source), f"{self.where}: {container['name']}: {m['name']} has no {m['subPath']}"
            mounts[m["mountPath"]] = source
        return dict(sorted(mounts.items(), key=lambda kv: -len(kv[0])))


def here(path, mounts, where):
    """Where a container path is on this machine, through its mounts; a path
    outside every mount would be on the image's read-only root."""
    for mount, local in mounts.items():
        if path == mount or path.startswith(mount.rstrip("/") + "/"):
            return local + path[len(mount):]
    raise AssertionError(f"{where}: {path} is on no mount (the root filesystem is read-only and holds none)")


def remap_args(args, mounts, where):
    out = []
    for a in args:
        flag, eq, value = a.partition("=")
        if eq and value.startswith("/"):
            out.append(f"{flag}={here(value, mounts, where)}")
        elif a.startswith("/"):
            out.append(here(a, mounts, where))
        else:
            out.append(a)
    return out


def remap_toml(path, mounts, where, scratch):
    """A copy of a TOML config with its absolute paths mapped."""
    with open(path, "rb") as f:
        doc = tomllib.load(f)

    def walk(x):
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, str) and x.startswith("/"):
            return here(x, mounts, where)
        return x
    doc = walk(doc)

    def dump(d, prefix=""):
        lines, tables = [], []
        for k, v in d.items():
            if isinstance(v, dict):
                tables.append((k, v))
            else:
                lines.append(f"{json.dumps(k)} = {json.dumps(v)}")
        text = "\n".join(lines) + "\n"
        for k, v in tables:
            text += f"\n[{prefix}{json.dumps(k)}]\n" + dump(v, f"{prefix}{json.dumps(k)}.")
        return text
    out = os.path.join(scratch, "config-" + os.path.basename(path))
    with open(out, "w") as f:
        f.write(dump(doc))
    return out


def run_binary(bin_dir, command, args, env, where):
    exe = os.path.join(bin_dir, command)
    clean = {k: v for k, v in env.items() if k != "__used__"}
    clean["PATH"] = os.environ.get("PATH", "")
    out = subprocess.run([exe, *args], capture_output=True, text=True, env=clean, timeout=60)
    assert out.returncode == 0, f"{where}: {command} {' '.join(args)} failed:\n{out.stdout}{out.stderr}"
    return out.stdout


def container_ports(container):
    return {(p["containerPort"], p.get("protocol", "TCP")): p.get("name") for p in container.get("ports", [])}


def port_of(addr):
    return int(addr.rsplit(":", 1)[1])


def check_probes(pod, container, where):
    named = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
    numbers = set(named.values())
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        p = container.get(probe)
        if not p:
            continue
        for how in ("httpGet", "tcpSocket", "grpc"):
            if how in p:
                port = p[how]["port"]
                assert port in named or port in numbers, f"{where}: {probe} on port {port}, which the container does not declare"


class Checker:
    def __init__(self, deploy, bin_dir):
        self.deploy, self.bin_dir = deploy, bin_dir
        with open(os.path.join(deploy, "schemas", "leaderworkerset-v1.json")) as f:
            self.lws_schema = strict(json.load(f)["schema"])
        etcd_help = subprocess.run(["etcd", "--help"], capture_output=True, text=True)
        self.etcd_flags = set(re.findall(r"--([a-z0-9-]+)", etcd_help.stdout + etcd_help.stderr))
        self.counts = {"overlays": 0, "resources": 0, "containers": 0, "binary runs": 0}

    def overlay(self, overlay):
        docs = render(self.deploy, overlay)
        validate(docs, self.lws_schema, overlay)
        self.counts["overlays"] += 1
        self.counts["resources"] += len(docs)
        images = {c["image"] for _, _, _, spec, _, _ in pod_templates(docs)
                  for c in spec.get("containers", []) + spec.get("initContainers", [])}
        assert len(images) == 1, f"{overlay}: every container runs the one image (kustomize images:), not {images}"
        pods = []
        for workload, pod_name, labels, spec, extra_env, claims in pod_templates(docs):
            with tempfile.TemporaryDirectory() as scratch:
                pod = Pod(docs, workload, pod_name, spec, extra_env, claims, scratch)
                listening = self.pod(pod, overlay)
            pods.append((labels, spec, listening))
        self.services(docs, pods, overlay)
        self.lws_names(docs, overlay)

    def pod(self, pod, overlay):
        """Runs the pod's containers' commands in order; returns the ports
        its binaries listen on."""
        listening = set()
        for container in pod.spec.get("initContainers", []) + pod.spec["containers"]:
            where = f"{overlay}: {pod.where}, container {container['name']}"
            self.counts["containers"] += 1
            env = pod.env_of(container)
            mounts = pod.mounts_of(container)
            command = [expand(x, env) for x in container.get("command", []) + container.get("args", [])]
            unresolved = [x for x in command if re.search(r"\$\([A-Za-z_]", x)]
            assert not unresolved, f"{where}: nothing sets {unresolved}"
            check_probes(pod, container, where)
            binary, args = command[0], command[1:]
            if binary == "etcd":
                for a in args:
                    flag = a.split("=", 1)[0].lstrip("-")
                    assert flag in self.etcd_flags, f"{where}: etcd has no flag --{flag}"
                listening |= {(2379, "TCP"), (2380, "TCP")}
                self.unused_env(env, container, set(), where)
                continue
            assert binary in ("coordinator", "worker", "tessera"), f"{where}: the image has no {binary}"
            args = remap_args(args, mounts, where)
            if binary == "tessera":
                assert args[:2] == ["certs", "init"], f"{where}: an unexpected tessera command {args[:2]}"
                run_binary(self.bin_dir, binary, args, {}, where)
                self.counts["binary runs"] += 1
                self.unused_env(env, container, set(), where)
                continue
            args = self.remap_config(args, mounts, where, pod.root)
            tessera_env = {k: (here(v, mounts, where) if v.startswith("/") else v)
                           for k, v in env.items() if k.startswith("TESSERA_")}
            out = run_binary(self.bin_dir, binary, [*args, "--check-config"], tessera_env, where)
            self.counts["binary runs"] += 1
            effective = json.loads(out)
            ports = self.binary_ports(binary, effective, container, where)
            listening |= ports
            self.unused_env(env, container, set(tessera_env), where)
            self.memory(binary, effective, container, where)
        return listening

    def remap_config(self, args, mounts, where, scratch):
        out = []
        for a in args:
            if a.startswith("--config="):
                out.append("--config=" + remap_toml(a.split("=", 1)[1], mounts, where, scratch))
            else:
                out.append(a)
        for i, a in enumerate(out[:-1]):
            if a == "--config":
                out[i + 1] = remap_toml(out[i + 1], mounts, where, scratch)
        return out

    def unused_env(self, env, container, read_by_binary, where):
        for e in container.get("env", []):
            name = e["name"]
            if name in env["__used__"] or name in read_by_binary or name in OUTSIDE:
                continue
            raise AssertionError(f"{where}: {name} is set but nothing reads it")

    def binary_ports(self, binary, effective, container, where):
        declared = container_ports(container)
        wanted = {(port_of(effective["listen"]), "UDP")}
        for key in ("http_listen", "grpc_listen"):
            if effective.get(key):
                wanted.add((port_of(effective[key]), "TCP"))
        for port in wanted:
            assert port in declared, f"{where}: {binary} listens on {port[0]}/{port[1]}, not a declared containerPort {sorted(declared)}"
        if binary == "worker" and effective.get("advertise"):
            assert port_of(effective["advertise"]) == port_of(effective["listen"]), \
                f"{where}: advertises {effective['advertise']} but listens on {effective['listen']}"
        if binary == "coordinator" and effective["ha"]["etcd"]:
            assert port_of(effective["ha"]["advertise"]) == port_of(effective["listen"]), \
                f"{where}: advertises {effective['ha']['advertise']} but listens on {effective['listen']}"
        return wanted

    def memory(self, binary, effective, container, where):
        if binary != "worker":
            return
        limit = container.get("resources", {}).get("limits", {}).get("memory")
        assert limit, f"{where}: a worker without a memory limit"
        offered = effective["memory_offered"].get("CPU")
        assert offered is not None, f"{where}: the worker's CPU memory is not tied to the container's limit"
        assert offered < quantity_bytes(limit), f"{where}: the planner may use {offered} B of a {limit} limit"

    def services(self, docs, pods, overlay):
        for svc in (d for d in docs if d["kind"] == "Service"):
            where = f"{overlay}: Service {svc['metadata']['name']}"
            selector = svc["spec"].get("selector", {})
            chosen = [(spec, listening) for labels, spec, listening in pods
                      if selector and all(labels.get(k) == v for k, v in selector.items())]
            assert chosen, f"{where}: selects no pod"
            for port in svc["spec"]["ports"]:
                proto = port.get("protocol", "TCP")
                target = port.get("targetPort", port["port"])
                for spec, listening in chosen:
                    declared = {}
                    for c in spec["containers"]:
                        for (number, p), name in container_ports(c).items():
                            declared[name] = (number, p)
                            declared[number] = (number, p)
                    assert target in declared, f"{where}: port {target} is no containerPort of the pods it selects"
                    number, p = declared[target]
                    assert p == proto, f"{where}: port {target} is {proto} here but {p} in the pod"
                    assert (number, p) in listening, f"{where}: nothing in the pod listens on {number}/{p}"

    def lws_names(self, docs, overlay):
        for lws in (d for d in docs if d["kind"] == "LeaderWorkerSet"):
            size = lws["spec"]["leaderWorkerTemplate"]["size"]
            leader = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
            config = next(v["configMap"]["name"] for v in leader["volumes"] if "configMap" in v)
            config_map = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == config)
            toml = tomllib.loads(config_map["data"]["cluster.toml"])
            names = [f"worker-{i}" for i in range(size)]
            for model, table in toml.get("models", {}).items():
                devices = table.get("devices", "")
                listed = re.findall(r"([A-Za-z0-9_.-]+)/", devices)
                assert sorted(set(listed)) == sorted(names), \
                    f"{overlay}: model {model}'s devices name {listed}, the group's workers are {names}"


def main():
    deploy, bin_dir = sys.argv[1], sys.argv[2]
    checker = Checker(deploy, bin_dir)
    overlays = ["base"] + [f"overlays/{o}" for o in sorted(os.listdir(os.path.join(deploy, "overlays")))]
    for overlay in overlays:
        checker.overlay(overlay)
        print(f"{overlay}: renders, validates (Kubernetes {KUBERNETES}, LWS v1) and agrees with the binaries")
    print("kubernetes: " + ", ".join(f"{v} {k}" for k, v in checker.counts.items()))


if __name__ == "__main__":
    main()
