// The finance dashboard. It shows only numbers the spend API serves: every chart and
// table is one API query, drawn as returned (arranged, never recomputed), and every
// table's export downloads that same query as the API's CSV.
//
// The key lives in sessionStorage (this tab only) and travels as a bearer header;
// it never appears in a URL.
"use strict";

(() => {
  const KEY_SLOT = "cascade-finance-key";
  const COLORS = [
    "#2563eb", "#16a34a", "#dc2626", "#9333ea", "#ea580c",
    "#0891b2", "#ca8a04", "#db2777", "#4b5563", "#65a30d",
  ];
  const USD_COLUMNS = new Set([
    "cost_usd", "reference_cost_usd", "savings_usd", "cost_per_1k_requests_usd",
    "unreferenced_cost_usd", "cache_savings_usd", "limit_usd", "soft_limit_usd", "spent_usd", "remaining_usd",
    "burn_rate_usd_per_day", "forecast_usd",
  ]);
  const PCT_COLUMNS = new Set(["savings_pct", "used_pct", "attainment_pct", "error_rate_pct"]);
  // Columns compared with the reference model: empty where a row has none.
  const REFERENCE_COLUMNS = new Set(["reference_cost_usd", "savings_usd", "savings_pct"]);
  const SPEND_COLUMNS = ["requests", "errors", "error_rate_pct", "calls", "cost_usd",
    "reference_cost_usd", "savings_usd", "savings_pct", "cost_per_1k_requests_usd"];
  // Narrow panels show fewer columns; their CSV export has them all.
  const SHORT_COLUMNS = ["requests", "errors", "error_rate_pct", "cost_usd", "savings_usd",
    "savings_pct"];
  const NONE = "—"; // a figure that does not exist (no reference, no requests), never a zero
  const NO_REFERENCE = "No reference model: the routes of these requests set no " +
    "reference_model, so there is nothing to compare their cost with.";
  const NO_REQUESTS = "No requests in this range: nothing to compare with the reference model.";
  const LABELS = {
    errors: "Errors", error_rate_pct: "Error rate",
    calls: "Upstream calls", cost_usd: "Cost", reference_cost_usd: "Reference cost", savings_usd: "Savings",
    savings_pct: "Savings %", cost_per_1k_requests_usd: "Per 1k requests", limit_usd: "Limit",
    cache_savings_usd: "Cache savings", cache_read_tokens: "Cached tokens",
    soft_limit_usd: "Soft limit", spent_usd: "Spent", remaining_usd: "Remaining", used_pct: "Used %",
    burn_rate_usd_per_day: "Burn / day", forecast_usd: "Forecast", soft_crossed: "Soft crossed",
    hard_crossed: "Hard crossed", exhausted_on: "Limit reached", ttft_ms: "TTFT target (ms)",
    timeout_ms: "Timeout target (ms)", sla_requests: "Judged", sla_met: "Met", sla_missed: "Missed",
    attainment_pct: "Attainment %",
  };

  const $ = (id) => document.getElementById(id);
  const charts = {};
  // table name -> {path, params, columns}: what is shown, and what "Export CSV" fetches
  const tables = {};
  const state = { loads: 0, budgets: [] };
  window.dashboard = { charts, tables, state };

  // ---- API ------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }

  async function api(path, params = {}, format = "json") {
    const query = new URLSearchParams({ ...params, format });
    const response = await fetch(`${path}?${query}`, {
      headers: { authorization: `Bearer ${sessionStorage.getItem(KEY_SLOT) || ""}` },
      cache: "no-store",
    });
    if (!response.ok) {
      let message = `${response.status} ${response.statusText}`;
      try { message = (await response.json()).error.message; } catch (_) { /* not JSON */ }
      throw new ApiError(response.status, message);
    }
    return format === "csv" ? response : response.json();
  }

  // ---- formatting (display only; the exact API value is kept in data-value) -------

  const usdFormat = new Intl.NumberFormat("en-US", { style: "currency", currency: "USD" });
  function usd(value) {
    if (value === null || value === undefined) return NONE;
    if (value === 0 || Math.abs(value) >= 1) return usdFormat.format(value);
    // Sub-dollar amounts: four significant digits, no exponent, no trailing zeros.
    const places = Math.min(9, 3 - Math.floor(Math.log10(Math.abs(value))));
    return `${value < 0 ? "-" : ""}$${Math.abs(value).toFixed(places).replace(/0+$/, "")}`;
  }
  const count = (value) => (value === null || value === undefined ? NONE : value.toLocaleString("en-US"));
  const pct = (value) => (value === null || value === undefined ? NONE : `${value.toFixed(2)}%`);

  function cellText(column, value) {
    if (USD_COLUMNS.has(column)) return usd(value);
    if (PCT_COLUMNS.has(column)) return pct(value);
    if (typeof value === "number") return count(value);
    if (typeof value === "boolean") return value ? "yes" : "no";
    return value === null || value === undefined ? NONE : String(value);
  }

  // Why a figure compared with the reference model is empty, or covers part of the row.
  function referenceNote(row) {
    if (!row.calls && !row.errors && !row.cost_nanos) return NO_REQUESTS; // no records at all
    if (row.reference_coverage === "none") return NO_REFERENCE;
    if (row.reference_coverage === "partial") {
      return `Compared for the requests on routes with a reference_model only; ` +
        `${usd(row.unreferenced_cost_usd)} spent on routes without one is left out.`;
    }
    return "";
  }

  // An API note ("no requests from ... to ...") as a sentence.
  const sentence = (note) => `${note[0].toUpperCase()}${note.slice(1)}.`;

  function renderTable(name, rows, columns, note) {
    const table = $(`table-${name}`);
    table.replaceChildren();
    const head = table.createTHead().insertRow();
    for (const column of columns) {
      const th = document.createElement("th");
      const words = column.replaceAll("_", " ");
      th.textContent = LABELS[column] || words[0].toUpperCase() + words.slice(1);
      th.dataset.column = column;
      head.appendChild(th);
    }
    const body = table.createTBody();
    for (const row of rows) {
      const tr = body.insertRow();
      for (const column of columns) {
        const td = tr.insertCell();
        td.textContent = cellText(column, row[column]);
        td.dataset.column = column;
        td.dataset.value = row[column] === null || row[column] === undefined ? "" : String(row[column]);
        if (typeof row[column] === "number" || USD_COLUMNS.has(column) || PCT_COLUMNS.has(column)) {
          td.classList.add("num");
        }
        if (REFERENCE_COLUMNS.has(column) && referenceNote(row)) {
          td.title = referenceNote(row);
          td.classList.add(row.reference_coverage === "none" ? "none" : "partial");
        }
        if (column === "error_rate_pct" && row.errors > 0) td.classList.add("bad");
      }
    }
    if (!rows.length) {
      const td = body.insertRow().insertCell();
      td.colSpan = columns.length;
      td.className = "empty";
      td.textContent = note ? sentence(note) : "Nothing in this range.";
    }
  }

  // ---- charts ---------------------------------------------------------------------

  const colorOf = (i) => COLORS[i % COLORS.length];

  function draw(name, config) {
    if (charts[name]) charts[name].destroy();
    config.options = {
      animation: false,
      responsive: true,
      maintainAspectRatio: false,
      ...config.options,
    };
    charts[name] = new Chart($(`chart-${name}`), config);
  }

  const usdTicks = { callback: (value) => usd(value) };

  function drawStack(rows, by) {
    const days = [...new Set(rows.map((r) => r.day))].sort();
    const groups = [...new Set(rows.map((r) => r[by]))].sort();
    const datasets = groups.map((group, i) => {
      const byDay = new Map(rows.filter((r) => r[by] === group).map((r) => [r.day, r.cost_usd]));
      return {
        label: group, backgroundColor: colorOf(i), data: days.map((d) => byDay.get(d) ?? null),
      };
    });
    draw("spend", {
      type: "bar",
      data: { labels: days, datasets },
      options: {
        scales: { x: { stacked: true }, y: { stacked: true, ticks: usdTicks } },
        plugins: { tooltip: { callbacks: { label: (c) => `${c.dataset.label}: ${usd(c.raw)}` } } },
      },
    });
  }

  function drawDaily(rows) {
    const labels = rows.map((r) => r.day);
    draw("savings", {
      type: "line",
      data: {
        labels,
        datasets: [
          { label: "Cost", data: rows.map((r) => r.cost_usd), borderColor: colorOf(0),
            backgroundColor: colorOf(0) },
          { label: "Reference cost", data: rows.map((r) => r.reference_cost_usd),
            borderColor: colorOf(2), backgroundColor: colorOf(2), borderDash: [6, 4] },
        ],
      },
      options: { scales: { y: { ticks: usdTicks, beginAtZero: true } } },
    });
    draw("per-1k", {
      type: "line",
      data: {
        labels,
        datasets: [{ label: "Cost per 1,000 requests", data: rows.map((r) => r.cost_per_1k_requests_usd),
          borderColor: colorOf(3), backgroundColor: colorOf(3) }],
      },
      options: { scales: { y: { ticks: usdTicks, beginAtZero: true } } },
    });
  }

  function drawTiers(rows) {
    draw("tiers", {
      type: "doughnut",
      data: {
        labels: rows.map((r) => r.tier),
        datasets: [{ label: "Requests", data: rows.map((r) => r.requests),
          backgroundColor: rows.map((_, i) => colorOf(i)) }],
      },
      options: { plugins: { legend: { position: "right" } } },
    });
  }

  function drawBudget(budget) {
    if (!budget) {
      draw("budget", { type: "line", data: { labels: [], datasets: [] } });
      return;
    }
    const labels = [...new Set([...budget.burn_down, ...budget.forecast].map((p) => p.day))].sort();
    const spent = new Map(budget.burn_down.map((p) => [p.day, p.cumulative_usd]));
    const forecast = new Map(budget.forecast.map((p) => [p.day, p.cumulative_usd]));
    const datasets = [
      { label: "Spent", data: labels.map((d) => spent.get(d) ?? null), borderColor: colorOf(0),
        backgroundColor: colorOf(0) },
      { label: "Forecast", data: labels.map((d) => forecast.get(d) ?? null), borderColor: colorOf(4),
        backgroundColor: colorOf(4), borderDash: [6, 4] },
      { label: "Limit", data: labels.map(() => budget.limit_usd), borderColor: colorOf(2),
        backgroundColor: colorOf(2), pointRadius: 0 },
    ];
    if (budget.soft_limit_usd !== null) {
      datasets.push({ label: "Soft limit", data: labels.map(() => budget.soft_limit_usd),
        borderColor: colorOf(6), backgroundColor: colorOf(6), pointRadius: 0, borderDash: [2, 3] });
    }
    draw("budget", {
      type: "line",
      data: { labels, datasets },
      options: { scales: { y: { ticks: usdTicks, beginAtZero: true } } },
    });
  }

  function drawSla(rows) {
    const judged = rows.filter((r) => r.attainment_pct !== null);
    $("chart-sla").parentElement.hidden = !judged.length; // nothing judged: the table says why
    draw("sla", {
      type: "bar",
      data: {
        labels: judged.map((r) => r.route),
        datasets: [{ label: "Requests meeting the SLA (%)", data: judged.map((r) => r.attainment_pct),
          backgroundColor: colorOf(1) }],
      },
      options: { indexAxis: "y", scales: { x: { min: 0, max: 100 } } },
    });
  }

  // ---- loading --------------------------------------------------------------------

  function filters() {
    const params = { from: $("from").value, to: $("to").value };
    if ($("team").value) params.team = $("team").value;
    return params;
  }

  async function show(name, path, params, columns) {
    tables[name] = { path, params, columns };
    const reply = await api(path, params);
    renderTable(name, reply.data, columns, reply.note);
    return reply;
  }

  async function refreshTeams(range) {
    const reply = await api("/v1/spend", { ...range, group_by: "team" });
    const select = $("team");
    const chosen = select.value;
    select.replaceChildren(new Option("All teams", ""));
    for (const row of reply.data) select.add(new Option(row.team, row.team));
    if (chosen && !reply.data.some((r) => r.team === chosen)) select.add(new Option(chosen, chosen));
    select.value = chosen;
  }

  async function load() {
    const range = { from: $("from").value, to: $("to").value };
    const params = filters();
    const by = $("stack-by").value;
    $("load-error").textContent = "";
    document.body.dataset.state = "loading";
    try {
      await refreshTeams(range);
      const [stack, daily, tiers, , , , budgets, sla] = await Promise.all([
        show("spend-stack", "/v1/spend", { ...params, group_by: `day,${by}` },
          ["day", by, ...SPEND_COLUMNS]),
        show("daily", "/v1/spend", { ...params, group_by: "day" }, ["day", ...SPEND_COLUMNS]),
        // A tier that only answers escalations has calls, not requests.
        show("tiers", "/v1/spend", { ...params, group_by: "tier" },
          ["tier", "requests", "errors", "error_rate_pct", "calls", "cost_usd", "savings_usd",
            "savings_pct"]),
        show("teams", "/v1/spend", { ...params, group_by: "team", sort: "-cost_usd", limit: "10" },
          ["team", ...SHORT_COLUMNS]),
        show("keys", "/v1/spend", { ...params, group_by: "key", sort: "-cost_usd", limit: "10" },
          ["key", ...SHORT_COLUMNS]),
        // Savings are per route: a route without a reference_model has none.
        show("routes", "/v1/spend", { ...params, group_by: "route", sort: "-cost_usd" },
          ["route", ...SHORT_COLUMNS]),
        show("budgets", "/v1/spend/budgets", params.team ? { team: params.team } : {},
          ["scope", "name", "period", "limit_usd", "soft_limit_usd", "spent_usd", "remaining_usd",
            "used_pct", "burn_rate_usd_per_day", "forecast_usd", "soft_crossed", "hard_crossed",
            "exhausted_on"]),
        show("sla", "/v1/spend/sla", params,
          ["route", "ttft_ms", "timeout_ms", "sla_requests", "sla_met", "sla_missed",
            "attainment_pct"]),
      ]);
      drawStack(stack.data, by);
      drawDaily(daily.data);
      drawTiers(tiers.data);
      showTotals(daily.total);
      showBudgets(budgets.data);
      drawSla(sla.data);
      $("range-note").textContent = `${daily.from} to ${daily.to} (UTC)`;
      state.loads += 1;
      document.body.dataset.state = "ready";
      document.body.dataset.loads = String(state.loads);
    } catch (error) {
      if (error.status === 401 || error.status === 403) return signOut(error.message);
      $("load-error").textContent = error.message;
      document.body.dataset.state = "error";
    }
  }

  function showTotals(total) {
    const noReference = total.reference_coverage === "none";
    $("kpi-cost").textContent = usd(total.cost_usd);
    $("kpi-reference").textContent = usd(total.reference_cost_usd);
    $("kpi-savings").textContent = usd(total.savings_usd);
    const part = total.reference_coverage === "partial" ? " where compared" : "";
    const nothing = referenceNote(total) === NO_REQUESTS;
    $("kpi-savings-pct").textContent = nothing ? "no requests"
      : noReference ? "no reference model" : `${pct(total.savings_pct)} saved${part}`;
    // What prompt caching saved on the tokens actually sent, beside what routing saved.
    $("kpi-cache-savings").textContent = usd(total.cache_savings_usd);
    $("kpi-cached-tokens").textContent = `${count(total.cache_read_tokens)} cached prompt tokens`;
    $("kpi-per-1k").textContent = usd(total.cost_per_1k_requests_usd);
    $("kpi-requests").textContent = count(total.requests);
    $("kpi-answered").textContent = `${count(total.requests - total.errors)} answered`;
    $("kpi-error-rate").textContent = pct(total.error_rate_pct);
    $("kpi-errors").textContent = `${count(total.errors)} of ${count(total.requests)} failed`;
    $("kpi-error-rate").classList.toggle("bad", total.errors > 0);
    for (const [id, column] of [["kpi-cost", "cost_usd"], ["kpi-reference", "reference_cost_usd"],
      ["kpi-savings", "savings_usd"], ["kpi-per-1k", "cost_per_1k_requests_usd"],
      ["kpi-requests", "requests"], ["kpi-savings-pct", "savings_pct"],
      ["kpi-error-rate", "error_rate_pct"], ["kpi-errors", "errors"],
      ["kpi-cache-savings", "cache_savings_usd"]]) {
      $(id).dataset.value = total[column] === null ? "" : String(total[column]);
    }
    // The savings figures say why they are empty, or what they leave out.
    const why = referenceNote(total);
    for (const id of ["kpi-reference", "kpi-savings", "kpi-savings-pct"]) $(id).title = why;
    $("note-savings").textContent = why;
    $("note-savings").hidden = !why;
  }

  function showBudgets(budgets) {
    state.budgets = budgets;
    const pick = $("budget-pick");
    const chosen = pick.value;
    pick.replaceChildren(...budgets.map((b, i) => new Option(`${b.scope} ${b.name} (${b.period})`, String(i))));
    // No budget, no burn-down: the table's note says why.
    $("chart-budget").parentElement.hidden = !budgets.length;
    pick.parentElement.hidden = !budgets.length;
    if (chosen && Number(chosen) < budgets.length) pick.value = chosen;
    const rows = $("table-budgets").tBodies[0]?.rows || [];
    budgets.forEach((b, i) => {
      if (!rows[i]) return;
      if (b.hard_crossed) rows[i].classList.add("over");
      else if (b.soft_crossed) rows[i].classList.add("warn");
    });
    drawBudget(budgets[Number(pick.value || 0)]);
  }

  async function exportCsv(name) {
    const table = tables[name];
    if (!table) return;
    try {
      const response = await api(table.path, table.params, "csv");
      const disposition = response.headers.get("content-disposition") || "";
      const filename = (/filename="([^"]+)"/.exec(disposition) || [])[1] || `${name}.csv`;
      const url = URL.createObjectURL(await response.blob());
      const link = document.createElement("a");
      link.href = url;
      link.download = filename;
      document.body.appendChild(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
    } catch (error) {
      $("load-error").textContent = `export failed: ${error.message}`;
    }
  }

  // ---- login ----------------------------------------------------------------------

  function signOut(message = "") {
    sessionStorage.removeItem(KEY_SLOT);
    $("dashboard").hidden = true;
    $("filters").hidden = true;
    $("actions").hidden = true;
    $("login").hidden = false;
    $("login-error").textContent = message;
    document.body.dataset.state = "login";
  }

  function signedIn() {
    $("login").hidden = true;
    $("dashboard").hidden = false;
    $("filters").hidden = false;
    $("actions").hidden = false;
    return load();
  }

  async function signIn(event) {
    event.preventDefault();
    const input = $("key");
    sessionStorage.setItem(KEY_SLOT, input.value.trim());
    input.value = "";
    try {
      await api("/v1/spend/access");
    } catch (error) {
      return signOut(error.message);
    }
    return signedIn();
  }

  function isoDay(date) { return date.toISOString().slice(0, 10); }

  function start() {
    const today = new Date();
    $("to").value = isoDay(today);
    $("from").value = isoDay(new Date(today.getTime() - 29 * 86400000));
    $("login-form").addEventListener("submit", signIn);
    $("filters").addEventListener("submit", (event) => { event.preventDefault(); load(); });
    $("stack-by").addEventListener("change", load);
    $("budget-pick").addEventListener("change", () => drawBudget(state.budgets[Number($("budget-pick").value)]));
    $("sign-out").addEventListener("click", () => signOut());
    $("print").addEventListener("click", () => window.print());
    for (const button of document.querySelectorAll("button.export")) {
      button.addEventListener("click", () => exportCsv(button.dataset.table));
    }
    window.addEventListener("beforeprint", () => Object.values(charts).forEach((c) => c.resize()));
    if (sessionStorage.getItem(KEY_SLOT)) signedIn();
  }

  start();
})();
