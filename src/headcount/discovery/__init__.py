"""Discovery: where engines come from (a static list, Kubernetes pods, Kubernetes Services).

`source.py` is the contract every source meets; `static.py` the fixed list;
for Kubernetes, `reflector.py` (list+watch with relist on every end),
`listwatch.py` (what a reflector talks to), `kube.py` (the client boundary),
`kubeconfig.py` (finding the cluster), `pods.py` and `services.py` (objects to
engines), `isolation.py` (one bad object never breaks the others),
`gc_pause.py`, `errors.py`, and `build.py` (sources wired from settings).
"""

__all__: list[str] = []
