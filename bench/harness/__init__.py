"""The benchmarks' shared harness: every script in bench/ imports from here (and from
the project's packages), never from another script.

processes  free ports, a server process started, waited for and stopped (Proc,
           launch), waits (wait_until), a process's CPU time and resident size
warmfleet  `warmfleet serve`, `warmfleet router` and `warmfleet up` as the benchmarks
           start them; waits for warm prompts and for a router following its daemons
peers      mlx_lm.server and vllm-mlx on the same weights with warmfleet's BLAS (their
           environments), a primed server of either kind, the converted model
client     streamed chat completions timed as a client sees them
workloads  shared prompt material: agent instructions, questions, stories, long agent
           transcripts
figures    how a set of measurements is printed
"""
