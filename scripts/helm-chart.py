#!/usr/bin/env python3
"""Runs the real Helm engine (Helm v4's Go SDK, the `helm-python-sdk` package, import name
helm_python) on a chart directory, for tests/project/helm.rs; no helm binary is needed.

    helm-chart.py lint CHART [KUBE_VERSION [VALUES_JSON]]
        helm lint --strict: prints its findings as JSON ({"messages": [...], "errors": [...]}).
    helm-chart.py render CHART NAME NAMESPACE [VALUES_JSON]
        helm template: prints {"manifests": "<every template's YAML, in file order>",
        "notes": "<NOTES.txt>"} as JSON; exit status 1 with Helm's error on stderr when the
        values are refused (values.schema.json) or a template fails.
    helm-chart.py template CHART NAME NAMESPACE [VALUES_JSON]
        The same manifests as `render`, printed as YAML, as `helm template` prints them: for a
        reader without a helm binary (docs/install.md, "With Helm").
    helm-chart.py schema CHART [VALUES_JSON]
        Checks values against values.schema.json: exit status 0, or 1 with Helm's reasons.
    helm-chart.py publish CHART OCI_REPOSITORY WORKDIR
        helm package, helm push to OCI_REPOSITORY (oci://HOST:PORT/PATH, plain http: a local
        registry), then helm pull of what was pushed, untarred into WORKDIR/pulled; prints
        {"package": ..., "pushed": <push's answer>, "pulled": <pull's answer>} as JSON."""
import json
import os
import sys

try:
    import helm_python as helm
except ImportError:
    sys.exit(
        "helm-python-sdk (import name helm_python) is not installed in this Python: run "
        "scripts/install-test-deps.sh (make test-deps)"
    )


def values(args, i):
    return json.loads(args[i]) if len(args) > i else {}


def publish(chart, repository, workdir):
    os.makedirs(f"{workdir}/package")
    package = helm.package(chart, destination=f"{workdir}/package")
    pushed = helm.push(package, repository, plain_http=True)
    meta = helm.Chart.load(chart).metadata
    pulled = helm.pull(
        f"{repository}/{meta['name']}",
        version=meta["version"],
        destination=f"{workdir}/package",
        untar=True,
        untar_dir=f"{workdir}/pulled",
        plain_http=True,
    )
    return {"package": package, "pushed": pushed, "pulled": pulled}


def main(args):
    command, chart = args[0], args[1]
    if command == "lint":
        kube_version = args[2] if len(args) > 2 else None
        lint = helm.lint(chart, values(args, 3), strict=True, kube_version=kube_version)
        print(json.dumps(lint))
        return 0
    try:
        if command in ("render", "template"):
            out = helm.Chart.load(chart).render(values(args, 4), name=args[2], namespace=args[3])
            notes = "".join(v for k, v in out.items() if k.endswith("/NOTES.txt"))
            manifests = "".join(
                f"---\n# Source: {k}\n{v}\n"
                for k, v in sorted(out.items())
                if k.endswith((".yaml", ".yml"))
            )
            if command == "template":
                sys.stdout.write(manifests)
            else:
                print(json.dumps({"manifests": manifests, "notes": notes}))
        elif command == "publish":
            print(json.dumps(publish(chart, args[2], args[3]), default=str))
        elif command == "schema":
            helm.Chart.load(chart).validate_schema(values(args, 2))
        else:
            print(f"unknown command {command}", file=sys.stderr)
            return 2
    except helm.HelmError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
