import os, sys, time, threading
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import common  # noqa
import django
django.setup()
from processes import ProcessGroup, free_port
from bench import noop_throughput as noop
from bench.common import JsonPoster, bench_tenant, purge_queues
from inference.dispatch.queues import service_queues
common.ensure_database(); common.clear_jobs()
noop.noop_service(); _, key = bench_tenant(); purge_queues(service_queues(noop.SERVICE))
def kids(pid):
    out=[]
    for t in os.listdir(f"/proc/{pid}/task"):
        out += Path(f"/proc/{pid}/task/{t}/children").read_text().split()
    return out
def cpu(pid):
    f=open(f"/proc/{pid}/stat").read().rsplit(")",1)[1].split()
    return (int(f[11])+int(f[12]))/os.sysconf("SC_CLK_TCK")
def ctx(pid):
    v=n=0
    for t in os.listdir(f"/proc/{pid}/task"):
        for line in open(f"/proc/{pid}/task/{t}/status"):
            if line.startswith("voluntary_ctxt_switches"): v+=int(line.split()[1])
            if line.startswith("nonvoluntary_ctxt_switches"): n+=int(line.split()[1])
    return v,n
with ProcessGroup() as procs:
    url = procs.web(free_port(), workers=1)
    procs.worker("bench-noop", service_queues(noop.SERVICE), extra=["--pool", "prefork"])
    web = kids(procs.procs["web"].pid)[0]
    cases = {
      "GET /healthz": lambda p: p.get("/healthz"),
      "GET /api/v1/queues": lambda p: p.get("/api/v1/services?limit=1"),
      "POST /api/v1/jobs (noop)": lambda p: p.post("/api/v1/jobs", {"service": noop.SERVICE, "input": {"texts": ["x"]}}),
    }
    for name, fn in cases.items():
        for clients in (1, 8):
            count=[0]; stop=time.time()+6
            def client():
                p=JsonPoster(url,key); n=0
                while time.time()<stop:
                    fn(p); n+=1
                count[0]+=n
            c0=cpu(web); x0=ctx(web); ts=[threading.Thread(target=client) for _ in range(clients)]
            [t.start() for t in ts]; [t.join() for t in ts]
            c1=cpu(web); x1=ctx(web)
            print(f"{name} x{clients}: {count[0]/6:.0f} req/s, web CPU {1000*(c1-c0)/count[0]:.3f} ms/req, ctx switches/req vol {(x1[0]-x0[0])/count[0]:.1f} invol {(x1[1]-x0[1])/count[0]:.1f}", flush=True)
