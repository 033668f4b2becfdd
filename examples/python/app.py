"""An endpoint for `kpar forward`, in Flask: one record per request on
/records, a batch of records (kpar forward --batch N) on /batch.

    python3 app.py    # listens on 127.0.0.1:8000 (PORT to change)
    kpar forward --brokers 127.0.0.1:9092 --group g --topic orders \\
      --content-type application/json --url http://127.0.0.1:8000/records
"""
import base64, json, os, threading
from flask import Flask, request

app = Flask(__name__)
done, lock = set(), threading.Lock()  # (topic, partition, offset) handled: kpar delivers at least once


def handle(record_id, order):  # your work; keep `done` with its results
    with lock:
        if record_id not in done:
            print("processed %s/%d/%d %s" % (*record_id, json.dumps(order)), flush=True)
            done.add(record_id)


@app.post("/records")
def one_record():  # a 4xx is dead-lettered at once, with its text
    if not request.is_json:
        return "not JSON: run kpar forward --content-type application/json", 415
    order = request.get_json(silent=True)
    if order is None:
        return "the value is not JSON", 422
    h = request.headers
    handle((h["Kpar-Topic"], int(h["Kpar-Partition"]), int(h["Kpar-Offset"])), order)
    return "", 204


@app.post("/batch")
def batch():  # one answer per record, in order; "error" goes to its dead letter
    answers = []
    for r in request.get_json():
        try:
            order = json.loads(base64.b64decode(r["value"]))
        except (TypeError, ValueError):
            answers.append({"status": 422, "error": "the value is not JSON"})
            continue
        handle((r["topic"], r["partition"], r["offset"]), order)
        answers.append({"status": 200})
    return answers


if __name__ == "__main__":
    app.run(host="127.0.0.1", port=int(os.environ.get("PORT", "8000")), threaded=True)
