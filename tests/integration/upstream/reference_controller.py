"""TEST DOUBLE: a minimal controller following the documented upstream behaviour.

It stands in for the AgentRL controller (written in Go, not on PyPI) to check that *our*
worker speaks the upstream worker protocol. It follows AgentBench's Python
``task_controller.py`` (registry by heartbeat, workers keyed by address, least-loaded
dispatch by free slots, session ids counted from 0) with the AgentRL-FC wire format of
docs/architecture.md section 4: ``session_id`` header, ``env_out`` from the worker's interact, the
worker's ``metric`` forwarded. Runs in the upstream virtual environment (FastAPI, httpx):

    python reference_controller.py PORT

It records every heartbeat it receives at ``GET /api/heartbeats`` for the tests.
"""

import sys

import httpx
import uvicorn
from fastapi import FastAPI, Header, HTTPException, Request
from fastapi.responses import JSONResponse

app = FastAPI()
tasks = {}  # name -> {"indices": [...], "workers": {address: {"capacity", "current"}}}
sessions = {}  # session id -> (task name, worker address)
heartbeats = []
state = {"next_id": 0}
http = httpx.AsyncClient(timeout=60)


@app.post("/api/receive_heartbeat")
async def receive_heartbeat(request: Request):
    data = await request.json()
    heartbeats.append(data)
    task = tasks.setdefault(data["name"], {"indices": data["indices"], "workers": {}})
    if task["indices"] != data["indices"]:
        raise HTTPException(400, "Error: Task already exists with different indices")
    worker = task["workers"].setdefault(data["address"], {"capacity": data["concurrency"], "current": 0})
    worker["capacity"] = data["concurrency"]
    return None


@app.get("/api/heartbeats")
async def list_heartbeats():
    return heartbeats


@app.get("/api/get_indices")
async def get_indices(name: str):
    if name not in tasks:
        raise HTTPException(400, "Error: Task does not exist")
    return tasks[name]["indices"]


@app.post("/api/start_sample")
async def start_sample(request: Request):
    data = await request.json()
    task = tasks.get(data["name"])
    if task is None:
        raise HTTPException(406, "Error: Task does not exist")
    free = {a: w["capacity"] - w["current"] for a, w in task["workers"].items()}
    address = max(free, key=free.get, default=None)
    if address is None or free[address] <= 0:
        raise HTTPException(406, "Error: No workers available")
    sid = state["next_id"]
    state["next_id"] += 1
    task["workers"][address]["current"] += 1
    response = await http.post(f"{address}/start_sample",
                               json={"index": data["index"], "session_id": sid, "custom_task": data.get("custom_task")})
    if response.status_code != 200:
        task["workers"][address]["current"] -= 1
        raise HTTPException(response.status_code, "Error: Worker returned error\n" + response.text)
    body = response.json()
    if body["status"] != "running":
        task["workers"][address]["current"] -= 1
    else:
        sessions[sid] = (data["name"], address)
    return JSONResponse(body, headers={"session_id": str(sid)})


@app.post("/api/interact")
async def interact(request: Request, session_id: int = Header(convert_underscores=False)):
    data = await request.json()
    if session_id not in sessions:
        raise HTTPException(400, "Error: Session does not exist")
    name, address = sessions[session_id]
    response = await http.post(f"{address}/interact", json={"session_id": session_id, "messages": data["messages"]})
    if response.status_code != 200:
        raise HTTPException(response.status_code, "Error: Worker returned error\n" + response.text)
    out = response.json()["env_out"]
    if out["status"] != "running":
        sessions.pop(session_id)
        tasks[name]["workers"][address]["current"] -= 1
    return out


@app.post("/api/cancel")
async def cancel(session_id: int = Header(convert_underscores=False)):
    if session_id not in sessions:
        raise HTTPException(400, "Error: Session does not exist")
    name, address = sessions.pop(session_id)
    response = await http.post(f"{address}/cancel", json={"session_id": session_id})
    tasks[name]["workers"][address]["current"] -= 1
    return response.json()


@app.get("/api/worker_sessions")
async def worker_sessions(address: str):
    return (await http.get(f"{address}/get_sessions")).json()


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
