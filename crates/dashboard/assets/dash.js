// Live updates: each SSE event is named after a fragment id and carries its new HTML (skipped
// when the page already shows that version). A stream the browser gave up on (an error answer
// instead of a stream, e.g. while a restart hands over) is opened again a second later.
(function () {
  var b = document.body, src = b.dataset.events;
  function connect() {
    var es = new EventSource(src);
    (b.dataset.fragments || "").split(" ").forEach(function (id) {
      es.addEventListener(id, function (e) {
        var el = document.getElementById(id), v = /data-v="(\w+)"/.exec(e.data);
        if (el && !(v && el.dataset.v === v[1])) el.outerHTML = e.data;
      });
    });
    es.onopen = function () { b.classList.remove("stale"); };
    es.onerror = function () {
      b.classList.add("stale");
      if (es.readyState === 2) setTimeout(connect, 1000);
    };
  }
  if (src && window.EventSource) connect();
  document.addEventListener("submit", function (e) {
    var m = e.target.dataset.confirm;
    if (m && !window.confirm(m)) e.preventDefault();
  });
  document.addEventListener("change", function (e) {
    if (e.target.id === "level") document.getElementById("logwrap").dataset.min = e.target.value;
  });
})();
