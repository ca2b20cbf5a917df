// Applies the console's live stream (Server-Sent Events) to a server-rendered page.
// Without JavaScript the page still shows every figure as of its load.
(function () {
  "use strict";
  var me = document.currentScript;
  if (!me || !window.EventSource) return;
  var source = new EventSource(me.dataset.stream);

  function setFields(root, row) {
    if (!root) return;
    Object.keys(row).forEach(function (key) {
      var cell = root.querySelector('[data-field="' + key + '"]');
      if (cell && cell.textContent !== String(row[key])) cell.textContent = row[key];
    });
  }

  function cell(tr, text) {
    var td = document.createElement("td");
    td.textContent = text;
    tr.appendChild(td);
  }

  function renderAlerts(alerts) {
    var body = document.querySelector("#active-alerts tbody");
    if (!body) return;
    body.replaceChildren();
    if (!alerts.length) {
      var empty = document.createElement("tr");
      empty.className = "empty";
      var td = document.createElement("td");
      td.colSpan = 5;
      td.textContent = "No alert is firing.";
      empty.appendChild(td);
      body.appendChild(empty);
      return;
    }
    alerts.forEach(function (a) {
      var tr = document.createElement("tr");
      tr.className = "alert-firing";
      [a.rule_id, a.kind, a.subject, a.value, a.threshold].forEach(function (t) { cell(tr, t); });
      body.appendChild(tr);
    });
  }

  var COLUMNS = ["visible", "in_flight", "delayed", "oldest", "send_rate", "ack_rate", "consumers"];

  function queueRow(q) {
    // The same markup the server renders (overview.html), built with textContent only.
    var tr = document.createElement("tr");
    tr.id = "queue-" + q.name;
    var th = document.createElement("th");
    th.scope = "row";
    var a = document.createElement("a");
    a.href = "/console/queues/" + encodeURIComponent(q.name);
    a.textContent = q.name;
    th.appendChild(a);
    tr.appendChild(th);
    COLUMNS.forEach(function (key) {
      var td = document.createElement("td");
      td.dataset.field = key;
      tr.appendChild(td);
    });
    return tr;
  }

  function renderQueues(doc) {
    // The page's rows follow the stream's listing (same filter and page): new queues are
    // added, deleted ones removed, existing rows updated in place.
    var body = document.querySelector("#queues tbody");
    if (!body) return;
    var keep = {};
    doc.queues.forEach(function (q) {
      var tr = document.getElementById("queue-" + q.name) || queueRow(q);
      setFields(tr, q);
      body.appendChild(tr); // appends a new row, moves an existing one into stream order
      keep[tr.id] = true;
    });
    Array.prototype.slice.call(body.children).forEach(function (tr) {
      if (!keep[tr.id]) body.removeChild(tr);
    });
    if (!doc.queues.length) {
      var empty = document.createElement("tr");
      empty.className = "empty";
      var td = document.createElement("td");
      td.colSpan = 8;
      td.textContent = "No queues yet.";
      empty.appendChild(td);
      body.appendChild(empty);
    }
  }

  function applyFragments(fragments) {
    // Parts of the page the server rendered again from the new sample (the same template
    // fragment the page was built with, escaped by the server): swapped in whole.
    Object.keys(fragments || {}).forEach(function (id) {
      var target = document.getElementById(id);
      if (target && target.innerHTML !== fragments[id]) target.innerHTML = fragments[id];
    });
  }

  source.addEventListener("fragments", function (event) {
    applyFragments(JSON.parse(event.data));
  });
  source.addEventListener("overview", function (event) {
    var doc = JSON.parse(event.data);
    renderQueues(doc);
    applyFragments(doc.fragments);
    renderAlerts(doc.alerts);
  });
  source.addEventListener("queue", function (event) {
    var doc = JSON.parse(event.data);
    setFields(document.getElementById("queue-stats"), doc.queue);
    var chart = document.getElementById("chart");
    if (chart) chart.innerHTML = doc.chart; // built and escaped by the server
    applyFragments(doc.fragments);
    renderAlerts(doc.alerts);
  });
  source.addEventListener("gone", function () { source.close(); });
})();
