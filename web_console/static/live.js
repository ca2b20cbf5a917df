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

  source.addEventListener("overview", function (event) {
    var doc = JSON.parse(event.data);
    doc.queues.forEach(function (q) { setFields(document.getElementById("queue-" + q.name), q); });
    renderAlerts(doc.alerts);
  });
  source.addEventListener("queue", function (event) {
    var doc = JSON.parse(event.data);
    setFields(document.getElementById("queue-stats"), doc.queue);
    var chart = document.getElementById("chart");
    if (chart) chart.innerHTML = doc.chart; // built and escaped by the server
    renderAlerts(doc.alerts);
  });
  source.addEventListener("gone", function () { source.close(); });
})();
