// The greenfed dashboard: reads the REST API with the tenant's bearer token and redraws
// every few seconds. Whatever the API returns enters the DOM as text (Text nodes,
// textContent, attribute values), never as markup.

const TOKEN_KEY = "greenfed.token";
const REFRESH_MS = 5000;
const NODE_PAGE_SIZE = 1000;
const MAX_NODE_PAGES = 10;
const MAX_NODE_ROWS = 500;
// Live work is read whole, however much of it waits in the queue: the cards and the
// zones count all of it. Finished work only fills the table, the newest of it; the usage
// card is the API's own totals (GET /v1/usage), never a sum of the rows loaded.
const LIVE_STATES = ["pending", "scheduled", "running"];
const FINISHED_STATES = ["succeeded", "failed", "cancelled"];
const TERMINAL_STATES = new Set(FINISHED_STATES);
const PLACED_STATES = new Set(["scheduled", "running"]); // hold accelerators somewhere
const LIVE_PAGE_SIZE = 1000;
const MAX_LIVE_PAGES = 10;
const WORK_ROWS = 50; // per collection (jobs, deployments), newest first
// Finished work whose final figures (its `work.usage` event) never come is read again
// for this long after it ended, then kept: a control plane that meters nothing, or one
// restarted meanwhile, sends none. The event comes usage.final_delay_s (30 s) and a
// flush (10 s) after the end by default.
const FINAL_USAGE_WAIT_MS = 10 * 60 * 1000;
// Printable ASCII without spaces, as every token is (gf_...). A pasted "…" or zero-width
// space cannot go into a header at all: fetch would throw before sending anything.
const TOKEN_SHAPE = /^[\x21-\x7e]+$/;
const NOT_A_TOKEN =
  "That is not a token: it has a space, a line break or a character outside ASCII " +
  "(such as “…”). Copy it again.";
const SVG_NS = "http://www.w3.org/2000/svg";

class ApiError extends Error {
  constructor(status, detail) {
    super(detail);
    this.status = status;
  }
}

// ---- the token: from the URL fragment (never sent to a server) into this tab's storage

// Whether the fragment held something that is no token (then nothing is stored).
function takeTokenFromFragment() {
  const fragment = new URLSearchParams(location.hash.slice(1));
  const token = fragment.get("token");
  if (token === null) return false;
  fragment.delete("token");
  const rest = fragment.toString();
  // Out of the address bar and the history entry too.
  history.replaceState(null, "", location.pathname + location.search + (rest ? `#${rest}` : ""));
  if (!token.trim()) return false;
  if (!TOKEN_SHAPE.test(token.trim())) return true;
  sessionStorage.setItem(TOKEN_KEY, token.trim());
  return false;
}

const storedToken = () => sessionStorage.getItem(TOKEN_KEY);

async function api(path, accept = "application/json") {
  const token = storedToken();
  if (!token) throw new ApiError(401, "no token");
  const response = await fetch(path, {
    headers: { Authorization: `Bearer ${token}`, Accept: accept },
    cache: "no-store",
    credentials: "omit",
  });
  if (!response.ok) {
    let detail = response.statusText;
    try {
      const problem = await response.json();
      detail = problem.detail || problem.title || detail;
    } catch {
      // not a problem+json body: the status text will do
    }
    throw new ApiError(response.status, detail);
  }
  return accept === "application/json" ? response.json() : response.text();
}

// ---- loading

// Up to `maxPages` pages of a listing (`params` and a cursor); `last` is the last page's
// body, `complete` whether the listing ended within them.
async function readPages(path, params, maxPages) {
  const items = [];
  let cursor = null;
  let last = null;
  for (let page = 0; page < maxPages; page += 1) {
    const query = new URLSearchParams(params);
    if (cursor) query.set("cursor", cursor);
    last = await api(`${path}?${query}`);
    items.push(...last.items);
    cursor = last.next_cursor;
    if (!cursor) return { items, last, complete: true };
  }
  return { items, last, complete: false };
}

async function loadNodes() {
  const { items, last } = await readPages("/v1/nodes", { limit: String(NODE_PAGE_SIZE) }, MAX_NODE_PAGES);
  return { items, total: last ? last.total : 0 };
}

async function listPages(collection, states, pageSize, maxPages) {
  const params = { state: states.join(","), limit: String(pageSize) };
  const { items, complete } = await readPages(`/v1/${collection}`, params, maxPages);
  return { items, complete };
}

const newestFirst = (items) => [...items].sort((a, b) => b.submitted_at.localeCompare(a.submitted_at));

// One collection's summaries: all its live work and its newest finished work. The first
// WORK_ROWS of them (newest first) are its rows in the table.
async function listWork(collection) {
  const [live, finished] = await Promise.all([
    listPages(collection, LIVE_STATES, LIVE_PAGE_SIZE, MAX_LIVE_PAGES),
    listPages(collection, FINISHED_STATES, WORK_ROWS, 1),
  ]);
  // Read a moment apart, work that ended meanwhile is in both: its newer view counts.
  const byId = new Map();
  for (const item of [...live.items, ...finished.items]) {
    const seen = byId.get(item.id);
    if (!seen || item.version > seen.version) byId.set(item.id, item);
  }
  const items = newestFirst(byId.values());
  return {
    collection,
    items,
    rows: new Set(items.slice(0, WORK_ROWS).map((item) => item.id)),
    liveComplete: live.complete,
    moreFinished: !finished.complete,
  };
}

// Usage goes on being metered after work ends (its node's last samples) without a new
// version: finished work's view is read again until the API has said its figures are
// final, then kept while its version stays the same. id -> {detail, final}.
const workDetails = new Map();
// Work whose `work.usage` event (its final figures) has been read, and the id of the
// last event read, to go on from.
const finalUsage = new Set();
let eventsReadTo = null;

function usageIsFinal(summary) {
  if (!TERMINAL_STATES.has(summary.state)) return false;
  if (summary.attempts === 0) return true; // never placed: nothing was metered
  if (finalUsage.has(summary.id)) return true;
  return Date.now() - Date.parse(summary.updated_at) > FINAL_USAGE_WAIT_MS;
}

function keptDetail(summary) {
  const cached = workDetails.get(summary.id);
  return cached?.final && cached.detail.version === summary.version ? cached.detail : null;
}

// Read the `work.usage` events that came since the last look (one request for all the
// finished rows that wait for theirs); a failure only means they are read again.
async function readFinalUsage(listings) {
  const waiting = listings
    .flatMap((listing) => listing.items.filter((item) => listing.rows.has(item.id)))
    .filter((item) => TERMINAL_STATES.has(item.state) && !usageIsFinal(item) && !keptDetail(item));
  if (!waiting.length) {
    eventsReadTo = null; // the next to wait starts from its own end
    return;
  }
  const query = new URLSearchParams({ follow: "false" });
  if (eventsReadTo !== null) query.set("after", eventsReadTo);
  else query.set("since", waiting.map((item) => item.updated_at).sort()[0]);
  let stream;
  try {
    stream = await api(`/v1/events?${query}`, "text/event-stream");
  } catch {
    return;
  }
  for (const message of stream.split("\n\n")) {
    const fields = { data: [] };
    for (const line of message.split("\n")) {
      const colon = line.indexOf(":");
      if (colon <= 0) continue;
      const name = line.slice(0, colon);
      const value = line.slice(colon + 1).replace(/^ /, "");
      if (name === "data") fields.data.push(value);
      else fields[name] = value;
    }
    if (fields.id !== undefined) eventsReadTo = fields.id;
    if (fields.event !== "work.usage") continue;
    try {
      const workId = JSON.parse(fields.data.join("\n")).work_id;
      if (workId) finalUsage.add(workId);
    } catch {
      // not an event view: nothing learnt from it
    }
  }
}

async function detailOf(collection, summary) {
  const kept = keptDetail(summary);
  if (kept) return kept;
  // Decided before reading: a view read after the final figures were told holds them.
  const final = usageIsFinal(summary);
  try {
    const detail = await api(`/v1/${collection}/${encodeURIComponent(summary.id)}`);
    workDetails.set(summary.id, { detail, final: final && detail.version === summary.version });
    return detail;
  } catch (error) {
    if (error instanceof ApiError && error.status === 404) return summary;
    throw error;
  }
}

// The full view of the table's rows, and of placed work (where it holds accelerators);
// the rest of the queue is counted from its summary.
// Placed work beyond the table's rows is read in full for the zones' load: at most this
// many per collection and refresh (newest first), a few requests at a time, so that an
// open dashboard never sends the control plane thousands of reads every refresh.
const MAX_PLACED_DETAILS = 500;
const DETAIL_REQUESTS_AT_ONCE = 8;

async function mapAtMost(items, atOnce, read) {
  const results = new Array(items.length);
  let next = 0;
  async function worker() {
    while (next < items.length) {
      const index = next++;
      results[index] = await read(items[index]);
    }
  }
  await Promise.all(Array.from({ length: Math.min(atOnce, items.length) }, worker));
  return results;
}

async function withDetails(listing) {
  let placed = 0;
  let capped = false;
  const wanted = new Set();
  for (const summary of listing.items) {
    if (listing.rows.has(summary.id)) wanted.add(summary.id);
    else if (PLACED_STATES.has(summary.state)) {
      if (placed < MAX_PLACED_DETAILS) {
        placed += 1;
        wanted.add(summary.id);
      } else capped = true;
    }
  }
  const items = await mapAtMost(listing.items, DETAIL_REQUESTS_AT_ONCE, (summary) =>
    wanted.has(summary.id) ? detailOf(listing.collection, summary) : summary,
  );
  return { ...listing, items, liveComplete: listing.liveComplete && !capped };
}

// The caller's usage over all time (every tenant's for the admin), one row per currency,
// as `GET /v1/usage` totals it: one request, whose answer is a row per tenant and
// currency. The table's rows are only the newest finished work: their sum is no total.
// Read at most once a minute per token: the API sums every hour row the caller has to
// answer, which grows with history, and usage moves by a flush at a time anyway.
const USAGE_REFRESH_MS = 60000;
let usageRead = null; // { token, at, rows } of the last good read

async function loadUsageTotals() {
  const token = storedToken();
  if (usageRead && usageRead.token === token && Date.now() - usageRead.at < USAGE_REFRESH_MS) {
    return usageRead.rows;
  }
  const report = await api("/v1/usage");
  if (!Array.isArray(report?.totals)) throw new Error("usage totals missing from the answer");
  const rows = report.totals.filter((row) => row && typeof row === "object");
  usageRead = { token, at: Date.now(), rows };
  return rows;
}

// Both collections, each settled on its own (one failing leaves the other shown).
async function loadWork() {
  const listed = await Promise.allSettled([listWork("jobs"), listWork("deployments")]);
  await readFinalUsage(listed.filter((r) => r.status === "fulfilled").map((r) => r.value));
  return Promise.allSettled(
    listed.map((result) =>
      result.status === "fulfilled" ? withDetails(result.value) : Promise.reject(result.reason),
    ),
  );
}

// What the page shows of the collections that loaded (null: neither did).
function combineWork(listings) {
  const loaded = listings.filter(Boolean);
  if (!loaded.length) return null;
  return {
    items: loaded.flatMap((listing) => listing.items),
    rows: loaded.flatMap((listing) => listing.items.filter((item) => listing.rows.has(item.id))),
    liveComplete: loaded.every((listing) => listing.liveComplete),
    moreFinished: loaded.some((listing) => listing.moreFinished),
  };
}

// ---- formatting

const numberFormat = new Intl.NumberFormat(undefined, { maximumFractionDigits: 1 });
const integerFormat = new Intl.NumberFormat(undefined, { maximumFractionDigits: 0 });

const isNumber = (value) => typeof value === "number" && Number.isFinite(value);

function formatPower(watts) {
  if (!isNumber(watts)) return "–";
  return watts >= 1000 ? `${numberFormat.format(watts / 1000)} kW` : `${integerFormat.format(watts)} W`;
}

function formatGrams(grams) {
  if (!isNumber(grams)) return "–";
  const size = Math.abs(grams);
  if (size >= 1e6) return `${numberFormat.format(grams / 1e6)} t`;
  if (size >= 1e3) return `${numberFormat.format(grams / 1e3)} kg`;
  return `${numberFormat.format(grams)} g`;
}

function formatEnergy(kwh) {
  if (!isNumber(kwh)) return "–";
  return Math.abs(kwh) < 1 ? `${integerFormat.format(kwh * 1000)} Wh` : `${numberFormat.format(kwh)} kWh`;
}

function formatMoney(amount, currency) {
  if (!isNumber(amount)) return "–";
  try {
    return new Intl.NumberFormat(undefined, { style: "currency", currency }).format(amount);
  } catch {
    return `${amount.toFixed(2)} ${currency ?? ""}`.trim();
  }
}

function formatAgo(iso) {
  const at = Date.parse(iso);
  if (Number.isNaN(at)) return "–";
  const seconds = Math.max(0, Math.round((Date.now() - at) / 1000));
  if (seconds < 60) return `${seconds} s ago`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)} h ago`;
  return new Date(at).toLocaleDateString();
}

const plural = (count, noun) => `${count} ${noun}${count === 1 ? "" : "s"}`;

const counted = (counts) =>
  Object.entries(counts)
    .filter(([, count]) => count > 0)
    .sort(([a], [b]) => a.localeCompare(b))
    .map(([key, count]) => `${key} ${count}`)
    .join(" · ");

function carbonLevel(gramsPerKwh) {
  if (gramsPerKwh < 150) return "low";
  if (gramsPerKwh < 400) return "mid";
  return "high";
}

// ---- DOM helpers (text only)

function h(tag, attributes = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value !== null && value !== undefined) element.setAttribute(name, String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    element.append(child instanceof Node ? child : String(child));
  }
  return element;
}

function bar(fraction, level) {
  const svg = document.createElementNS(SVG_NS, "svg");
  svg.setAttribute("class", "bar");
  svg.setAttribute("viewBox", "0 0 100 8");
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("aria-hidden", "true");
  const shown = Math.min(1, Math.max(0, isNumber(fraction) ? fraction : 0));
  for (const [width, className] of [[100, "track"], [shown * 100, `fill ${level}`]]) {
    const rect = document.createElementNS(SVG_NS, "rect");
    rect.setAttribute("width", String(width));
    rect.setAttribute("height", "8");
    rect.setAttribute("rx", "2");
    rect.setAttribute("class", className);
    svg.append(rect);
  }
  return svg;
}

const badge = (text, kind, title) => h("span", { class: `badge ${kind}`, title }, text);

function notice(section, text) {
  const element = section.querySelector(".notice");
  element.textContent = text ?? "";
  element.hidden = !text;
}

function emptyRow(columns, text) {
  return h("tr", { class: "empty" }, h("td", { colspan: columns }, text));
}

// ---- what the page shows

function nodeZones(nodes) {
  return new Map(nodes.map((node) => [node.node_id, node.zone]));
}

// Where each live piece of work holds accelerators: zone -> {accelerators, work ids}.
function tenantLoadByZone(work, zoneOf) {
  const load = new Map();
  for (const item of work) {
    if (TERMINAL_STATES.has(item.state)) continue;
    for (const allocation of item.allocations ?? []) {
      const zone = zoneOf.get(allocation.node_id);
      if (zone === undefined) continue;
      const entry = load.get(zone) ?? { accelerators: 0, work: new Set() };
      entry.accelerators += allocation.accelerators;
      entry.work.add(item.id);
      load.set(zone, entry);
    }
  }
  return load;
}

// A usage's cost per currency, by currency (amounts in different currencies are never
// summed): `costs`, or from a server older than it, `cost` in `currency`.
function costsOf(usage) {
  if (usage.costs && typeof usage.costs === "object") {
    return Object.entries(usage.costs)
      .filter(([, amount]) => isNumber(amount))
      .sort(([a], [b]) => a.localeCompare(b));
  }
  return isNumber(usage.cost) && usage.currency ? [[usage.currency, usage.cost]] : [];
}

const formatCosts = (costs) => costs.map(([currency, amount]) => formatMoney(amount, currency)).join(" + ");

// The totals rows of `GET /v1/usage` (one per currency) as one card: grams and kWh add
// up across them, money stays per currency. Emissions avoided stay unknown (null) while
// no row has a counterfactual to compare with.
function usageTotals(rows) {
  const totals = { avoided: null, emitted: 0, energy: 0, costs: new Map() };
  for (const row of rows) {
    if (isNumber(row.avoided_gco2eq_g)) totals.avoided = (totals.avoided ?? 0) + row.avoided_gco2eq_g;
    if (isNumber(row.gco2eq_g)) totals.emitted += row.gco2eq_g;
    if (isNumber(row.energy_kwh)) totals.energy += row.energy_kwh;
    if (isNumber(row.cost) && typeof row.currency === "string" && row.currency) {
      totals.costs.set(row.currency, (totals.costs.get(row.currency) ?? 0) + row.cost);
    }
  }
  return totals;
}

function setCard(id, value, detail) {
  document.getElementById(`card-${id}`).textContent = value;
  document.getElementById(`card-${id}-detail`).textContent = detail ?? "";
}

// The usage card from the settled read of `GET /v1/usage`: a failed read says so (a 0
// or the last figure would read as current).
function renderUsageCard(result) {
  if (result.status === "rejected") {
    setCard("avoided", "–", `unavailable: ${result.reason?.message ?? result.reason}`);
    return;
  }
  if (!result.value.length) {
    setCard("avoided", "–", "no usage reported yet");
    return;
  }
  const totals = usageTotals(result.value);
  const costs = formatCosts([...totals.costs].sort(([a], [b]) => a.localeCompare(b)));
  setCard(
    "avoided",
    formatGrams(totals.avoided),
    `CO₂eq · emitted ${formatGrams(totals.emitted)} · ${formatEnergy(totals.energy)}${costs ? ` · ${costs}` : ""}`,
  );
}

function renderCards(nodes, work) {
  if (nodes) {
    const online = nodes.items.filter((node) => node.state === "online");
    const sites = {};
    const kinds = {};
    let accelerators = 0;
    let powerW = 0;
    const utilisations = [];
    for (const node of nodes.items) {
      sites[node.site] = (sites[node.site] ?? 0) + 1;
      for (const [kind, count] of Object.entries(node.accelerator_counts)) {
        kinds[kind] = (kinds[kind] ?? 0) + count;
        accelerators += count;
      }
    }
    for (const node of online) {
      if (isNumber(node.power_w)) powerW += node.power_w;
      if (isNumber(node.accelerator_utilization_pct)) utilisations.push(node.accelerator_utilization_pct);
    }
    const meanUtilisation = utilisations.length
      ? utilisations.reduce((sum, value) => sum + value, 0) / utilisations.length
      : null;
    setCard("nodes", `${online.length}/${nodes.total}`, counted(sites));
    setCard("accelerators", integerFormat.format(accelerators), counted(kinds));
    setCard(
      "power",
      formatPower(powerW),
      meanUtilisation === null ? "" : `mean utilisation ${integerFormat.format(meanUtilisation)} %`,
    );
  } else {
    for (const id of ["nodes", "accelerators", "power"]) setCard(id, "–", "");
  }
  if (work) {
    const live = work.filter((item) => !TERMINAL_STATES.has(item.state));
    const states = {};
    for (const item of live) states[item.state] = (states[item.state] ?? 0) + 1;
    const jobs = live.filter((item) => item.kind === "training").length;
    const waiting = (states.pending ?? 0) + (states.scheduled ?? 0);
    setCard(
      "work",
      `${states.running ?? 0} running`,
      `${waiting} waiting · ${plural(jobs, "live job")} · ${plural(live.length - jobs, "live deployment")}`,
    );
  } else {
    setCard("work", "–", "");
  }
}

function renderZones(section, signals, nodes, work) {
  const body = section.querySelector("tbody");
  const zoneOf = nodeZones(nodes?.items ?? []);
  const load = tenantLoadByZone(work ?? [], zoneOf);
  const byZone = new Map();
  const entry = (zone) => {
    if (!byZone.has(zone)) byZone.set(zone, { zone, signal: null, nodes: 0, online: 0, powerW: 0 });
    return byZone.get(zone);
  };
  for (const signal of signals?.zones ?? []) entry(signal.zone).signal = signal;
  for (const node of nodes?.items ?? []) {
    const zone = entry(node.zone);
    zone.nodes += 1;
    if (node.state === "online") {
      zone.online += 1;
      if (isNumber(node.power_w)) zone.powerW += node.power_w;
    }
  }
  // Cleanest first; zones without a signal last.
  const zones = [...byZone.values()].sort(
    (a, b) =>
      (a.signal?.carbon_g_per_kwh ?? Infinity) - (b.signal?.carbon_g_per_kwh ?? Infinity) ||
      a.zone.localeCompare(b.zone),
  );
  const scale = Math.max(1, ...zones.map((zone) => zone.signal?.next_24h_max_carbon_g_per_kwh ?? 0));
  const rows = zones.map((zone) => {
    const signal = zone.signal;
    const mine = load.get(zone.zone);
    const carbon = signal?.carbon_g_per_kwh;
    const level = isNumber(carbon) ? carbonLevel(carbon) : "none";
    return h(
      "tr",
      { "data-zone": zone.zone },
      h("td", {}, h("span", { class: "zone-name" }, zone.zone),
        signal?.stale ? badge("stale", "warn", "the newest reading is old") : null),
      h("td", { class: "bar-col" }, bar(isNumber(carbon) ? carbon / scale : 0, level)),
      h("td", { class: `num carbon ${level}`, "data-carbon": isNumber(carbon) ? carbon : null },
        isNumber(carbon) ? integerFormat.format(carbon) : "–"),
      h("td", { class: "num muted", title: signal ? `cleanest hour ${signal.next_24h_cleanest_hour}` : null },
        signal
          ? `${integerFormat.format(signal.next_24h_min_carbon_g_per_kwh)}–${integerFormat.format(signal.next_24h_max_carbon_g_per_kwh)}`
          : "–"),
      h("td", { class: "num" }, signal && isNumber(signal.price_per_mwh) ? formatMoney(signal.price_per_mwh, signal.currency) : "–"),
      h("td", { class: "num" }, `${zone.online}/${zone.nodes}`),
      h("td", { class: "num" }, formatPower(zone.powerW)),
      h("td", { class: `num${mine ? " mine" : " muted"}`, "data-allocated": mine?.accelerators ?? 0 }, mine ? mine.accelerators : "0"),
      h("td", { class: `num${mine ? " mine" : " muted"}` }, mine ? mine.work.size : "0"),
    );
  });
  body.replaceChildren(...(rows.length ? rows : [emptyRow(9, "No zones yet.")]));
}

function placement(item, zoneOf) {
  const nodeIds = [...new Set(item.nodes ?? (item.allocations ?? []).map((a) => a.node_id))];
  if (!nodeIds.length) {
    const why = item.reason ?? (TERMINAL_STATES.has(item.state) ? "–" : "waiting to be placed");
    return h("span", { class: "reason", title: item.reason }, why);
  }
  const zones = [...new Set(nodeIds.map((id) => zoneOf.get(id)).filter(Boolean))];
  const shown = nodeIds.slice(0, 3).join(", ") + (nodeIds.length > 3 ? ` +${nodeIds.length - 3}` : "");
  return h(
    "span",
    { class: "placement", title: nodeIds.join(", ") },
    h("span", { class: "nodes-list" }, shown),
    zones.length ? h("span", { class: "zones-list" }, zones.join(", ")) : null,
  );
}

function shape(item) {
  if (item.kind === "training") {
    return [item.kind, `${item.workers}×${item.accelerators_per_worker} ${item.accelerator_kind}`];
  }
  const ready = (item.replica_states ?? []).filter((replica) => replica.state === "ready").length;
  return [item.kind, `${ready}/${item.replicas} replicas ready`];
}

function renderWork(section, work, nodes) {
  const body = section.querySelector("tbody");
  const zoneOf = nodeZones(nodes?.items ?? []);
  const rows = newestFirst(work.rows).map((item) => {
    const usage = item.usage && typeof item.usage === "object" ? item.usage : null;
    const measured = usage && isNumber(usage.measured_share)
      ? `${integerFormat.format(usage.measured_share * 100)} % measured${usage.fallback ? ", rest estimated" : ""}`
      : null;
    return h(
      "tr",
      { "data-work-id": item.id, "data-state": item.state },
      h("td", { class: "name" }, h("span", {}, item.name), h("span", { class: "id" }, item.id)),
      h("td", { class: "kind" }, ...shape(item).map((line) => h("span", {}, line))),
      h("td", { class: "state" }, badge(item.state, `state-${item.state}`, item.reason)),
      h("td", {}, item.priority),
      h("td", {}, placement(item, zoneOf)),
      h("td", { class: "num", title: measured }, usage ? formatEnergy(usage.energy_kwh) : "–"),
      h("td", { class: "num" }, usage ? formatGrams(usage.gco2eq_g) : "–"),
      h("td", { class: "num" }, usage ? formatCosts(costsOf(usage)) || "–" : "–"),
      h("td", { class: "num good" }, usage ? formatGrams(usage.avoided_gco2eq_g) : "–"),
      h("td", { class: "num muted", title: item.submitted_at }, formatAgo(item.submitted_at)),
    );
  });
  body.replaceChildren(...(rows.length ? rows : [emptyRow(10, "No jobs or deployments yet.")]));
}

// Says so where the table is not all there is (as the fleet's does).
function workNotice(work) {
  const notes = [];
  if (work.rows.length < work.items.length || work.moreFinished) {
    const of = `${work.items.length}${work.moreFinished ? "+" : ""}`;
    const left = work.moreFinished ? " (older finished ones are left out)" : "";
    notes.push(`Showing the newest ${work.rows.length} of ${of} jobs and deployments${left}.`);
  }
  if (!work.liveComplete) notes.push("Only the newest live ones are counted.");
  return notes.join(" ") || null;
}

function acceleratorText(node) {
  const devices = node.accelerators.filter((a) => a.kind !== "cpu");
  const shown = devices.length ? devices : node.accelerators;
  const models = new Map();
  for (const accelerator of shown) models.set(accelerator.model, (models.get(accelerator.model) ?? 0) + 1);
  return [...models].map(([model, count]) => `${count}× ${model}`).join(", ");
}

function renderNodes(section, nodes) {
  const body = section.querySelector("tbody");
  const shown = nodes.items.slice(0, MAX_NODE_ROWS);
  const rows = shown.map((node) => {
    const utilisation = node.accelerator_utilization_pct;
    return h(
      "tr",
      { "data-node-id": node.node_id, "data-state": node.state },
      h("td", { class: "name" }, node.node_id),
      h("td", {}, badge(node.state, `state-${node.state}`, node.offline_reason)),
      h("td", {}, node.site),
      h("td", { class: "zone" }, node.zone),
      h("td", { class: "accelerators" },
        ...Object.keys(node.accelerator_counts).sort().map((kind) => badge(kind, "kind")),
        acceleratorText(node)),
      h("td", { class: "bar-col" }, bar(isNumber(utilisation) ? utilisation / 100 : 0, "util"),
        h("span", { class: "bar-label" }, isNumber(utilisation) ? `${integerFormat.format(utilisation)} %` : "–")),
      h("td", { class: "num" }, formatPower(node.power_w)),
      h("td", { class: "num muted", title: node.last_seen_at }, formatAgo(node.last_seen_at)),
    );
  });
  body.replaceChildren(...(rows.length ? rows : [emptyRow(8, "No nodes have reported yet.")]));
  const hidden = nodes.items.length - shown.length;
  const unread = nodes.total - nodes.items.length;
  notice(section, hidden + unread > 0 ? `Showing ${shown.length} of ${plural(nodes.total, "node")}.` : null);
}

// ---- the refresh loop

const sections = {
  zones: () => document.getElementById("zones"),
  work: () => document.getElementById("work"),
  nodes: () => document.getElementById("nodes"),
};

function failure(result) {
  if (result.status === "fulfilled") return null;
  const error = result.reason;
  if (error instanceof ApiError && error.status === 403) return "Not visible with this token.";
  return `Could not load: ${error?.message ?? error}`;
}

function setStatus(text, isError = false) {
  const status = document.getElementById("status");
  status.textContent = text;
  status.classList.toggle("error", isError);
}

let timer = null;
let generation = 0;
// The token whose work the table shows: kept through an outage, never shown to another.
let workShownFor = null;

function schedule() {
  clearTimeout(timer);
  timer = setTimeout(refresh, REFRESH_MS);
}

async function refresh() {
  clearTimeout(timer);
  const token = storedToken();
  if (!token) {
    showSignIn();
    return;
  }
  if (!TOKEN_SHAPE.test(token)) {
    forgetToken(NOT_A_TOKEN);
    return;
  }
  if (document.hidden) return; // picked up again on visibilitychange
  const started = (generation += 1);
  const [nodesResult, signalsResult, workResults, usageResult] = await Promise.allSettled([
    loadNodes(),
    api("/v1/signals"),
    loadWork(),
    loadUsageTotals(),
  ]);
  // loadWork settles each collection itself; should it throw anyway, both failed.
  const workSettled = workResults.status === "fulfilled" ? workResults.value : [workResults, workResults];
  const results = [nodesResult, signalsResult, ...workSettled, usageResult];
  if (started !== generation) return; // a newer refresh (or a new token) took over
  const rejected = results.find(
    (result) => result.status === "rejected" && result.reason instanceof ApiError && result.reason.status === 401,
  );
  if (rejected) {
    forgetToken("That token was rejected: it is unknown or was rotated.");
    return;
  }
  const [nodes, signals, jobs, deployments] = results.map((r) => (r.status === "fulfilled" ? r.value : null));
  const work = combineWork([jobs, deployments]);
  if (work) {
    const known = new Set(work.items.map((item) => item.id));
    for (const id of workDetails.keys()) if (!known.has(id)) workDetails.delete(id);
    for (const id of finalUsage) if (!known.has(id)) finalUsage.delete(id);
  }

  showDashboard();
  renderCards(nodes, work?.items ?? null);
  renderUsageCard(usageResult);
  renderZones(sections.zones(), signals, nodes, work?.items ?? null);
  notice(sections.zones(), failure(results[1]));
  if (work) {
    renderWork(sections.work(), work, nodes);
    workShownFor = token;
  } else if (workShownFor !== token) {
    sections.work().querySelector("tbody").replaceChildren(); // another token's: gone
  } // else the rows stay as last loaded: not knowing now is not having none
  const workNotes = new Set([failure(results[2]), failure(results[3]), work ? workNotice(work) : null]);
  notice(sections.work(), [...workNotes].filter(Boolean).join(" ") || null);
  if (nodes) renderNodes(sections.nodes(), nodes);
  else {
    sections.nodes().querySelector("tbody").replaceChildren();
    notice(sections.nodes(), failure(results[0]));
  }
  const failed = results.filter((result) => result.status === "rejected").length;
  if (failed === results.length) setStatus("Cannot reach the control plane, retrying…", true);
  else setStatus(`Updated ${new Date().toLocaleTimeString()}`);
  schedule();
}

function showDashboard() {
  document.getElementById("signin").hidden = true;
  document.getElementById("dashboard").hidden = false;
  document.getElementById("forget-token").hidden = false;
}

function showSignIn(message) {
  clearTimeout(timer);
  document.getElementById("dashboard").hidden = true;
  document.getElementById("forget-token").hidden = true;
  document.getElementById("signin").hidden = false;
  const error = document.getElementById("signin-error");
  error.textContent = message ?? "";
  error.hidden = !message;
  setStatus("");
  document.getElementById("token-input").focus();
}

function forgetToken(message) {
  generation += 1;
  sessionStorage.removeItem(TOKEN_KEY);
  workDetails.clear();
  finalUsage.clear();
  usageRead = null;
  eventsReadTo = null;
  workShownFor = null;
  sections.work().querySelector("tbody").replaceChildren();
  showSignIn(message);
}

// A token from the fragment, then a refresh; something that is no token replaces the
// stored one (it was meant to) and the form says why.
function refreshWithFragment(refused = takeTokenFromFragment()) {
  usageRead = null; // asked for now: every figure afresh
  if (refused) forgetToken(NOT_A_TOKEN);
  else refresh();
}

function start() {
  const refused = takeTokenFromFragment();
  document.getElementById("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const input = document.getElementById("token-input");
    const token = input.value.trim();
    input.value = "";
    if (!token) return;
    if (!TOKEN_SHAPE.test(token)) {
      showSignIn(NOT_A_TOKEN);
      return;
    }
    sessionStorage.setItem(TOKEN_KEY, token);
    setStatus("Loading…");
    refresh();
  });
  document.getElementById("forget-token").addEventListener("click", () => forgetToken());
  window.addEventListener("hashchange", () => refreshWithFragment());
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) refresh();
  });
  if (storedToken() && !refused) setStatus("Loading…");
  refreshWithFragment(refused);
}

start();
