"""OpenAI-API load generator for oscar-ray deployments (a tool beside the package, not part of it).

    python -m load_tests run --target http://127.0.0.1:8000 --workload load_tests/workloads/short_random.yaml
    python -m load_tests compare --a bf16=http://127.0.0.1:8000/bf16 --b oscar=http://127.0.0.1:8000/oscar ...

See load_tests/README.md. It imports httpx, PyYAML and matplotlib only; the fault scripts in
load_tests/faults/ also start the Serve app through oscar_ray.
"""
