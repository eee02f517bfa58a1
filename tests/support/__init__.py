"""What the tests share (pytest puts tests/ on sys.path, so `from support.X import ...`):
`engine` (models, requests and engine stepping), `kv` (warm-without-prefill prompts and
a peer), `processes` (real `warmfleet serve`/`router` processes, an app or a stdlib
handler served in process), `router` (tiny daemons with a router in front, a Fleet over
fake backends), `scripted` (a model that follows a script, for tool calls and grammar
masks), `openapi` (the schemathesis settings), `kubeemu` (kmock's Kubernetes emulator
taught our CRDs), `cluster` (a real cluster for the e2e suites), `helm`, `promql`."""
