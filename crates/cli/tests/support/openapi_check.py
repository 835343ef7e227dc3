"""Checks the agent's answers against its OpenAPI description.

Usage: openapi_check.py SPEC BASE_URL PID NAME
Each listed request must answer with the status given, and its JSON body must be valid
under the schema the description gives for that status. Exit status 0 when all are;
77 when the validator modules are missing (the caller skips then).
"""
import json
import sys
import urllib.error
import urllib.request

try:
    import yaml
    from openapi_schema_validator import OAS30Validator
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT4
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

spec_path, base, pid, name = sys.argv[1:5]
spec = yaml.safe_load(open(spec_path))
registry = Registry().with_resource(
    "spec", Resource.from_contents(spec, default_specification=DRAFT4)
)


def global_refs(o):
    """Local `#/…` references, made relative to the registered description."""
    if isinstance(o, dict):
        return {
            k: ("spec" + v if k == "$ref" and v.startswith("#") else global_refs(v))
            for k, v in o.items()
        }
    if isinstance(o, list):
        return [global_refs(x) for x in o]
    return o


def schema(template, status):
    response = spec["paths"][template]["get"]["responses"][str(status)]
    if "$ref" in response:
        response = spec["components"]["responses"][response["$ref"].split("/")[-1]]
    return global_refs(response["content"]["application/json"]["schema"])


def check(template, url, status):
    try:
        body, got = urllib.request.urlopen(base + url).read(), 200
    except urllib.error.HTTPError as e:
        body, got = e.read(), e.code
    assert got == status, f"{url}: status {got}, expected {status}: {body[:200]!r}"
    validator = OAS30Validator(schema(template, status), registry=registry)
    errors = [e.message for e in validator.iter_errors(json.loads(body))]
    assert not errors, f"{url}: {errors[:3]}"
    print(f"ok {url} {got}")


dev = f"/v1/devices/{pid}/{name}"
for template, url, status in [
    ("/v1/node/topology", "/v1/node/topology", 200),
    ("/v1/devices", "/v1/devices", 200),
    ("/v1/devices", f"/v1/devices?pid={pid}", 200),
    ("/v1/devices", "/v1/devices?pid=x", 400),
    ("/v1/devices", "/v1/devices?pid=1", 404),
    ("/v1/devices/{pid}/{name}", dev, 200),
    ("/v1/devices/{pid}/{name}", f"/v1/devices/{pid}/nosuchdevice", 404),
    ("/v1/devices/{pid}/{name}/qps", dev + "/qps", 200),
    ("/v1/devices/{pid}/{name}/counters", dev + "/counters", 200),
    ("/v1/qps", "/v1/qps", 200),
    ("/v1/qps", "/v1/qps?pid=0", 400),
    ("/v1/counters", "/v1/counters", 200),
]:
    check(template, url, status)
