#!/usr/bin/env python3
"""Validates the custom resources in rendered manifests against their projects' API models,
strictly: an unknown field is an error too (the models alone would ignore it, and the API server
would drop it silently).

- cert-manager.io/v1 (Certificate, Issuer, ...): cert-manager's models,
  `cloudcoil-models-cert-manager` (PyPI);
- monitoring.coreos.com/v1 (PodMonitor, PrometheusRule, ...): prometheus-operator's models,
  `cloudcoil-models-prometheus-operator` (PyPI).
Both are generated from the projects' CustomResourceDefinitions (their OpenAPI schemas).

    kubectl kustomize kustomize/ | python3 scripts/validate-custom-resources.py -

Prints `OK Kind/name` or `FAIL Kind/name: why` per object; exit status 0 when every such object
validates (and there was one), 1 otherwise. Other objects are left to kubernetes-validate."""
import importlib
import sys

import yaml

# API group → the module holding its models, one submodule per version.
GROUPS = {
    "cert-manager.io": "cloudcoil.models.cert_manager",
    "monitoring.coreos.com": "cloudcoil.models.prometheus_operator",
}


def unknown_fields(given, kept, path=""):
    """Keys present in the input but dropped by the model: fields the API does not have."""
    problems = []
    if isinstance(given, dict) and isinstance(kept, dict):
        for key, value in given.items():
            if key not in kept:
                problems.append(f"{path}.{key}".lstrip("."))
            else:
                problems += unknown_fields(value, kept[key], f"{path}.{key}")
    elif isinstance(given, list) and isinstance(kept, list):
        for i, (g, k) in enumerate(zip(given, kept)):
            problems += unknown_fields(g, k, f"{path}[{i}]")
    return problems


def check(doc):
    """None when `doc` validates, else why not."""
    group, _, version = str(doc.get("apiVersion", "")).rpartition("/")
    try:
        module = importlib.import_module(f"{GROUPS[group]}.{version}")
    except ImportError:
        return f"{doc.get('apiVersion')} is not a version this validator knows"
    model = getattr(module, doc.get("kind", ""), None)
    if model is None:
        return f"{doc.get('apiVersion')} has no kind {doc.get('kind')}"
    try:
        obj = model.model_validate(doc)
    except Exception as e:  # pydantic's ValidationError, whatever its version
        lines = str(e).splitlines()
        return f"{lines[0]} {' '.join(lines[1:3])}"
    extra = unknown_fields(doc, obj.model_dump(by_alias=True, exclude_unset=True, mode="json"))
    return f"unknown fields {', '.join(extra)}" if extra else None


def main():
    source = sys.stdin if sys.argv[1:] in ([], ["-"]) else open(sys.argv[1])
    checked, failed = 0, 0
    for doc in yaml.safe_load_all(source):
        if not doc or str(doc.get("apiVersion", "")).rpartition("/")[0] not in GROUPS:
            continue
        name = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        problem = check(doc)
        if problem:
            print(f"FAIL {name}: {problem}")
            failed += 1
        else:
            print(f"OK {name}")
            checked += 1
    if checked == 0 and failed == 0:
        print("FAIL no custom resources of " + ", ".join(GROUPS) + " found")
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
