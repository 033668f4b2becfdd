// An endpoint for `kpar forward`, with express: one record per request on
// /records, a batch of records (kpar forward --batch N) on /batch.
//
//   npm ci && node app.js   # listens on 127.0.0.1:8000 (PORT to change)
//   kpar forward --brokers 127.0.0.1:9092 --group g --topic orders \
//     --content-type application/json --url http://127.0.0.1:8000/records
const express = require("express");

const app = express();
// express.json() reads bodies sent with --content-type application/json
// (without it req.body stays undefined). Its default limit is 100kb: a
// larger record would get 413, which kpar dead-letters at once (a 4xx).
// Set it above your largest record; with --batch N, above N records in
// base64 (4/3 of their size) and their fields.
app.use(express.json({ limit: "10mb" }));
const done = new Set(); // "topic/partition/offset" handled: kpar delivers at least once

function handle(id, order) { // your work; keep `done` with its results
  if (done.has(id)) return;
  console.log(`processed ${id} ${JSON.stringify(order)}`);
  done.add(id);
}

app.post("/records", (req, res) => { // a 4xx is dead-lettered at once, with its text
  if (!req.is("application/json")) return res.status(415).send("not JSON: run kpar forward --content-type application/json");
  handle(`${req.get("Kpar-Topic")}/${req.get("Kpar-Partition")}/${req.get("Kpar-Offset")}`, req.body);
  res.sendStatus(204);
});

app.post("/batch", (req, res) => { // one answer per record, in order; "error" goes to its dead letter
  res.json(req.body.map((r) => {
    let order;
    try { order = JSON.parse(Buffer.from(r.value, "base64").toString()); }
    catch { return { status: 422, error: "the value is not JSON" }; }
    handle(`${r.topic}/${r.partition}/${r.offset}`, order);
    return { status: 200 };
  }));
});

app.use((err, req, res, next) => { // a value that is not JSON: 422, not express's HTML page
  if (err.type !== "entity.parse.failed") return next(err);
  res.status(422).send("the value is not JSON");
});

app.listen(Number(process.env.PORT || 8000), "127.0.0.1");
