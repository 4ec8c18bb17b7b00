#!/usr/bin/env python3
"""Validates the cert-manager objects (cert-manager.io/v1) in rendered manifests against the
cert-manager API models of `cloudcoil-models-cert-manager` (PyPI), strictly: an unknown field is
an error too (the models alone would ignore it).

    kubectl kustomize kustomize/ | python3 scripts/validate-cert-manager.py -

Exit status 0 when every cert-manager object validates, 1 otherwise (one line per problem)."""
import sys

import yaml
from cloudcoil.models.cert_manager import v1


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


def main():
    source = sys.stdin if sys.argv[1:] in ([], ["-"]) else open(sys.argv[1])
    checked, failed = 0, 0
    for doc in yaml.safe_load_all(source):
        if not doc or not str(doc.get("apiVersion", "")).startswith("cert-manager.io/"):
            continue
        name = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        model = getattr(v1, doc.get("kind", ""), None)
        if doc.get("apiVersion") != "cert-manager.io/v1" or model is None:
            print(f"FAIL {name}: not a cert-manager.io/v1 kind this validator knows")
            failed += 1
            continue
        try:
            obj = model.model_validate(doc)
        except Exception as e:  # pydantic's ValidationError, whatever its version
            print(f"FAIL {name}: {str(e).splitlines()[0]} {' '.join(str(e).splitlines()[1:3])}")
            failed += 1
            continue
        extra = unknown_fields(doc, obj.model_dump(by_alias=True, exclude_unset=True, mode="json"))
        if extra:
            print(f"FAIL {name}: unknown fields {', '.join(extra)}")
            failed += 1
            continue
        print(f"OK {name}")
        checked += 1
    if checked == 0 and failed == 0:
        print("FAIL no cert-manager objects found")
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
