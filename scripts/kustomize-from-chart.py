#!/usr/bin/env python3
"""kustomize/base rendered from the Helm chart, charts/tolerable: one source for what is
deployed. Run from the repository root with the test tools' Python (`make generate` does,
after the reference files; `make test-deps` installs helm-python-sdk and pyyaml there):

    kustomize-from-chart.py generate
        Renders the chart with its defaults as release `tolerable` in `tolerable-system` (what
        kustomize/base installs, cert-manager's certificates) and writes one
        kustomize/base/<template>.yaml per chart template that renders objects, without what
        only Helm has (see `normalise`). The ConfigMap is left out: kustomize generates it from
        kustomize/base/tolerable.toml (written by `tolerable reference`), so its name carries
        kustomize's hash suffix and a changed config rolls the Pods.
        Then each component of COMPONENTS (below), as what the chart's render with its values
        adds (resources, one file per template), removes (`$patch: delete`) and changes (JSON
        patches; a config key as a TOLERABLE_* variable, so that components compose) against the
        defaults' render; the prose heading its kustomization.yaml is kept.
    kustomize-from-chart.py components
        COMPONENTS as JSON {component: values}.
    kustomize-from-chart.py print
        What `generate` would write, as JSON {path: text}, writing nothing (the drift test).
    kustomize-from-chart.py chart VALUES_JSON
        The chart rendered with VALUES_JSON (as `generate` renders it), normalised: a JSON list
        of objects sorted by kind, namespace and name.
    kustomize-from-chart.py kustomize FILE
        `kubectl kustomize`'s output in FILE, normalised the same way, as the same JSON list.

Normalised (both sides, so that kustomize's render of base + component equals the chart's
render with the matching values, object by object):
- Helm's hooks (`helm test`'s Pods, the uninstall Job releasing gated Pods) are dropped: kustomize
  has no hooks.
- The labels only a Helm release has (managed-by, helm.sh/chart, instance: the release name,
  version: the chart's) and the checksum/* annotations (kustomize's name suffixes roll the Pods
  instead) are dropped, in labels and in selectors alike.
- kustomize's generated ConfigMaps and Secrets lose their hash suffix, wherever named.
- tolerable's config: the ConfigMap's tolerable.toml is parsed, and the tolerable container's
  TOLERABLE_<SECTION>__<KEY> variables with a literal value are folded into it (kustomize's
  components set config through the environment, so that several compose; the chart writes the
  file): what tolerable loads is compared, not how it is spelled.
- PrometheusRules' strings with each run of white space one space (kustomize re-encodes
  folded scalars with blank lines Helm does not write).
- What only kustomize has: the Namespace (Helm does not own its release's namespace) and the
  registry credentials Secret (the operator's, mounted when it exists, in the chart)."""
import json
import os
import re
import sys
import tomllib

try:
    import helm_python as helm
    import yaml
except ImportError:
    sys.exit(
        "helm-python-sdk (import name helm_python) or pyyaml is not installed in this Python: "
        "run scripts/install-test-deps.sh (make test-deps)"
    )

CHART = "charts/tolerable"
BASE = "kustomize/base"
RELEASE, NAMESPACE = "tolerable", "tolerable-system"
HELM_ONLY_LABELS = (
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "helm.sh/chart",
)
# The chart templates whose objects kustomize makes otherwise (configMapGenerator).
NOT_IN_BASE = ("configmap.yaml",)
ONLY_IN_KUSTOMIZE = {("Namespace", NAMESPACE), ("Secret", "tolerable-registry-creds")}
CONFIG_MAP = "tolerable-config"


def helm_only(key):
    return key in HELM_ONLY_LABELS or key.startswith("checksum/")


def strip_helm(value):
    """`value` without Helm-only labels and annotations; maps left empty by that removed."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if helm_only(key):
                continue
            item = strip_helm(item)
            if key in ("labels", "annotations") and item == {}:
                continue
            out[key] = item
        return out
    if isinstance(value, list):
        return [strip_helm(item) for item in value]
    return value


def is_hook(doc):
    return "helm.sh/hook" in ((doc.get("metadata") or {}).get("annotations") or {})


def render(values):
    """The chart's templates as {file name: text}, in file order."""
    out = helm.Chart.load(CHART).render(values, name=RELEASE, namespace=NAMESPACE)
    prefix = "tolerable/templates/"
    return {
        k[len(prefix) :]: v
        for k, v in sorted(out.items())
        if k.startswith(prefix) and "/" not in k[len(prefix) :] and k.endswith(".yaml")
    }


HELM_LINE = re.compile(
    r"^\s*(?:app\.kubernetes\.io/(?:managed-by|instance|version)|helm\.sh/chart|checksum/[^:]*):"
)


def cleaned_text(text):
    """Helm's text of one document without the Helm-only lines (and the comments just above
    them), and without the `labels:`/`annotations:` keys left with nothing under them: the
    template's comments and layout kept."""
    lines = [l for l in text.splitlines() if not l.startswith("# Source: ")]
    kept = []
    for line in lines:
        if HELM_LINE.match(line):
            indent = len(line) - len(line.lstrip())
            while kept and kept[-1].strip().startswith("#") and (
                len(kept[-1]) - len(kept[-1].lstrip()) == indent
            ):
                kept.pop()
            continue
        kept.append(line)
    out = []
    for i, line in enumerate(kept):
        stripped = line.strip()
        if stripped in ("labels:", "annotations:"):
            indent = len(line) - len(line.lstrip())
            rest = [l for l in kept[i + 1 :] if l.strip() and not l.strip().startswith("#")]
            if not rest or len(rest[0]) - len(rest[0].lstrip()) <= indent:
                continue
        out.append(line)
    text = "\n".join(out).strip("\n")
    return re.sub(r"\n{3,}", "\n\n", text) + "\n"


def rendered(values):
    """The chart's objects rendered with `values`, hooks left out: (template file, the
    document's text as `cleaned_text` makes it, the object)."""
    out = []
    for name, text in render(values).items():
        for part in re.split(r"(?m)^---\s*$", text):
            doc = yaml.safe_load(part)
            if not doc or is_hook(doc):
                continue
            cleaned = cleaned_text(part)
            if yaml.safe_load(cleaned) != strip_helm(doc):
                sys.exit(f"{name}: the cleaned text does not parse as the normalised object")
            out.append((name, cleaned, doc))
    return out


def header(source, values=None):
    rendered_with = "its defaults" if values is None else f"the values\n#   {json.dumps(values)}\n#"
    return (
        f"# Generated from {source}\n# by scripts/kustomize-from-chart.py (`make generate`): "
        f"edit the chart, not this file.\n# Rendered with {rendered_with} as release {RELEASE} "
        f"in {NAMESPACE}.\n"
    )


def template_files(directory, objects, values=None):
    """{directory/<template>: text} of `objects` ((template, text, object)), one file per
    chart template."""
    files = {}
    for name, text, _ in objects:
        path = f"{directory}/{name}"
        if path not in files:
            files[path] = header(f"{CHART}/templates/{name}", values)
        else:
            files[path] += "---\n"
        files[path] += text
    return files


def base_files():
    """{path: text} of kustomize/base's files rendered from the chart."""
    objects = [o for o in rendered({}) if o[0] not in NOT_IN_BASE]
    return template_files(BASE, objects)


def env_value(text):
    """An environment variable's text as the TOML value tolerable reads it as, for the scalars
    components set (booleans, integers, strings)."""
    if text in ("true", "false"):
        return text == "true"
    if re.fullmatch(r"-?[0-9]+", text):
        return int(text)
    return text


def fold_config(docs):
    """tolerable.toml parsed, with the tolerable container's TOLERABLE_* literals folded in."""
    config_map = next(
        (d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == CONFIG_MAP),
        None,
    )
    if config_map is None:
        return
    config = tomllib.loads(config_map["data"]["tolerable.toml"])
    for doc in docs:
        if doc["kind"] != "Deployment" or doc["metadata"]["name"] != RELEASE:
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            kept = []
            for var in container.get("env", []):
                name = var["name"]
                if name.startswith("TOLERABLE_") and "__" in name and "value" in var:
                    section, key = name[len("TOLERABLE_") :].lower().split("__", 1)
                    table = config.setdefault(section, {})
                    if isinstance(table.get(key), list):
                        table[key] = [env_value(v) for v in var["value"].split(",") if v]
                    else:
                        table[key] = env_value(var["value"])
                else:
                    kept.append(var)
            if "env" in container:
                container["env"] = kept
    config_map["data"]["tolerable.toml"] = config


def without_suffixes(docs):
    """kustomize's generated names (name-<10 characters>) without their hash, everywhere."""
    names = {}
    for doc in docs:
        if doc["kind"] in ("ConfigMap", "Secret"):
            name = doc["metadata"]["name"]
            stem, _, hash = name.rpartition("-")
            if stem and len(hash) == 10 and hash.isalnum():
                names[name] = stem

    def walk(value):
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return names.get(value, value) if isinstance(value, str) else value

    return [walk(d) for d in docs]


def collapse_white_space(value):
    if isinstance(value, dict):
        return {k: collapse_white_space(v) for k, v in value.items()}
    if isinstance(value, list):
        return [collapse_white_space(v) for v in value]
    return " ".join(value.split()) if isinstance(value, str) else value


def normalise(docs):
    docs = [strip_helm(d) for d in docs if d and not is_hook(d)]
    for doc in docs:
        # kustomize re-encodes the PromQL's folded scalars with a blank line before their
        # more-indented lines, Helm (like the YAML spec) without: the same query.
        if doc["kind"] == "PrometheusRule":
            doc["spec"] = collapse_white_space(doc["spec"])
    docs = without_suffixes(docs)
    docs = [d for d in docs if (d["kind"], d["metadata"]["name"]) not in ONLY_IN_KUSTOMIZE]
    fold_config(docs)
    key = lambda d: (d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"])
    return sorted(docs, key=key)


# The components rendered from the chart: each is what the chart's render with these values
# adds to, removes from and changes in its render with the defaults. monitoring, shared-cache,
# namespaced-pull-secrets, credential-provider-image and crash-heal are hand-written (their
# headers say why); tests/project/kustomize.rs holds all of them to the chart.
COMPONENTS = {
    "events": {"config": {"events": {"on_admission": True}}},
    "crash-watch": {"config": {"crashes": {"watch": True}}},
    "gates": {"config": {"policy": {"on_lookup_failure": "gate"}}},
    "daemonsets": {"webhook": {"daemonSets": True}},
    "manage-node-taints": {"config": {"nodes": {"manage_taints": True}}},
    "no-node-watch": {"config": {"nodes": {"watch": False}}},
    "no-namespace-policy": {"config": {"policy": {"namespace_policy": False}}},
    "no-pull-secrets": {"config": {"credentials": {"read_pull_secrets": False}}},
    "node-credential-providers": {"credentialProviders": {"node": {"enabled": True}}},
    "gke-private-cluster": {"config": {"server": {"listen_addr": "0.0.0.0:10250"}}},
    "eks-overlay-cni": {
        "hostNetwork": True,
        "config": {"server": {"listen_addr": "0.0.0.0:10260", "metrics_addr": "0.0.0.0:10261"}},
    },
    "aks": {"webhook": {"labels": {"admissions.enforcer/disabled": "true"}}},
}


def key_of(doc):
    return (doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"])


def json_patch(old, new, path, ops):
    """RFC 6902 operations turning `old` into `new`: lists that only grow get `add .../-` (so
    that components touching one list compose), other changed lists are replaced whole."""
    if old == new:
        return
    if isinstance(old, dict) and isinstance(new, dict):
        for k in old:
            if k not in new:
                ops.append({"op": "remove", "path": f"{path}/{pointer(k)}"})
        for k, v in new.items():
            if k in old:
                json_patch(old[k], v, f"{path}/{pointer(k)}", ops)
            else:
                ops.append({"op": "add", "path": f"{path}/{pointer(k)}", "value": v})
    elif isinstance(old, list) and isinstance(new, list) and len(new) == len(old):
        for i, (a, b) in enumerate(zip(old, new)):
            json_patch(a, b, f"{path}/{i}", ops)
    elif isinstance(old, list) and isinstance(new, list) and new[: len(old)] == old:
        ops.extend({"op": "add", "path": f"{path}/-", "value": v} for v in new[len(old) :])
    else:
        ops.append({"op": "replace", "path": path, "value": new})


def pointer(key):
    return key.replace("~", "~0").replace("/", "~1")


def env_text(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def config_env(old, new):
    """The TOLERABLE_<SECTION>__<KEY> variables setting what `new` changes in `old` (the
    config tables): components set config through the environment, so that several compose."""
    out = []
    for section, table in new.items():
        for key, value in table.items():
            if old.get(section, {}).get(key) != value:
                name = f"TOLERABLE_{section.upper()}__{key.upper()}"
                out.append({"name": name, "value": env_text(value)})
    return out


def component_patches(base, changed):
    """The kustomize patches making `base`'s objects `changed`'s ({key: object} each)."""
    patches = []
    for key in sorted(set(base) - set(changed)):
        doc = base[key]
        meta = {"name": doc["metadata"]["name"]}
        patches.append(
            {"$patch": "delete", "apiVersion": doc["apiVersion"], "kind": key[0], "metadata": meta}
        )
    env = []
    config = (("ConfigMap", NAMESPACE, CONFIG_MAP),)
    for key in config:
        if key in base and key in changed:
            old, new = base[key]["data"]["tolerable.toml"], changed[key]["data"]["tolerable.toml"]
            env = config_env(old, new)
    for key in sorted(set(base) & set(changed)):
        if key in config:
            continue
        ops = []
        json_patch(base[key], changed[key], "", ops)
        if key[0] == "Deployment" and key[2] == RELEASE and env:
            containers = base[key]["spec"]["template"]["spec"]["containers"]
            i = next(i for i, c in enumerate(containers) if c["name"] == RELEASE)
            ops.extend(
                {"op": "add", "path": f"/spec/template/spec/containers/{i}/env/-", "value": e}
                for e in env
            )
            env = []
        if ops:
            patches.append({"target": {"kind": key[0], "name": key[2]}, "ops": ops})
    if env:
        sys.exit("config changed but the Deployment has no container to set it in")
    return patches


def prose(directory):
    """The hand-written comment block heading a component's kustomization.yaml."""
    try:
        with open(f"{directory}/kustomization.yaml") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return ""
    block = []
    for line in lines:
        if not line.startswith("#") or line.startswith("# Generated "):
            break
        block.append(line)
    return "".join(f"{l}\n" for l in block)


def component_files(name, values):
    """{path: text} of kustomize/components/<name>."""
    directory = f"kustomize/components/{name}"
    base_objects, objects = rendered({}), rendered(values)
    base = {key_of(d): d for d in normalise([o[2] for o in base_objects])}
    changed = {key_of(d): d for d in normalise([o[2] for o in objects])}
    added = [o for o in objects if key_of(o[2]) not in base and o[0] not in NOT_IN_BASE]
    files = template_files(directory, added, values)
    body = "apiVersion: kustomize.config.k8s.io/v1alpha1\nkind: Component\n"
    if files:
        body += "resources:\n" + "".join(f"  - {p.rsplit('/', 1)[1]}\n" for p in files)
    patches = component_patches(base, changed)
    if patches:
        body += "patches:\n"
    for patch in patches:
        if "ops" in patch:
            body += "  - target:\n" + indent(yaml.safe_dump(patch["target"], sort_keys=False), 6)
            body += "    patch: |-\n"
            text = yaml.safe_dump(patch["ops"], sort_keys=False, width=100)
        else:
            body += "  - patch: |-\n"
            text = yaml.safe_dump(patch, sort_keys=False, width=100)
        body += indent(text, 6)
    marker = header("the chart", values).replace("this file", "what follows")
    files[f"{directory}/kustomization.yaml"] = prose(directory) + marker + body
    return files


def indent(text, n):
    return "".join(" " * n + l + "\n" for l in text.splitlines())


def generated_files():
    files = base_files()
    for name, values in COMPONENTS.items():
        files.update(component_files(name, values))
    return files


def main(args):
    command = args[0] if args else ""
    if command == "generate":
        files = generated_files()
        # A generated component's directory holds what was generated, nothing else.
        for name in COMPONENTS:
            directory = f"kustomize/components/{name}"
            for stale in set(os.listdir(directory)):
                if f"{directory}/{stale}" not in files:
                    os.remove(f"{directory}/{stale}")
        for path, text in files.items():
            with open(path, "w") as f:
                f.write(text)
    elif command == "print":
        print(json.dumps(generated_files()))
    elif command == "components":
        print(json.dumps(COMPONENTS))
    elif command == "chart":
        text = "\n---\n".join(render(json.loads(args[1])).values())
        print(json.dumps(normalise(list(yaml.safe_load_all(text)))))
    elif command == "kustomize":
        with open(args[1]) as f:
            print(json.dumps(normalise(list(yaml.safe_load_all(f)))))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except helm.HelmError as e:
        sys.exit(str(e))
