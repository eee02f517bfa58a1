"""What the tests share (pytest puts tests/ on sys.path, so `from support.X import ...`):
`engine` (models, requests and engine stepping), `kv` (warm-without-prefill prompts),
`processes` (real `warmfleet serve`/`router` processes, an app served in process),
`scripted` (a model that follows a script, for tool calls and grammar masks),
`kubeemu` (kmock's Kubernetes emulator taught our CRDs), `helm`, `promql`."""
