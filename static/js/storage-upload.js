/* A dataset's upload from the browser: resumable, in chunks, with progress.
 *
 * POST the file's name and size to the volume's upload endpoint (the same file again resumes:
 * the answer's `offset` says where), then PATCH chunks at that offset with an Upload-Offset
 * header. A 409 (another offset) or a lost connection asks the server where it stands and
 * continues from there, so nothing is sent twice and a broken upload continues where it stopped.
 */
(function () {
  "use strict";
  var CHUNK = 8 * 1024 * 1024;

  function csrf() {
    var m = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
    return m ? decodeURIComponent(m[1]) : "";
  }

  function call(method, url, body, headers) {
    var h = Object.assign({ "X-CSRFToken": csrf(), "Accept": "application/json" }, headers || {});
    return fetch(url, { method: method, body: body, headers: h, credentials: "same-origin" }).then(
      function (r) {
        return r.json().catch(function () { return {}; }).then(function (data) {
          return { status: r.status, data: data };
        });
      }
    );
  }

  function wait(ms) { return new Promise(function (ok) { setTimeout(ok, ms); }); }

  function upload(form) {
    var url = form.getAttribute("data-url");
    var input = form.querySelector("input[type=file]");
    var bar = form.querySelector("progress");
    var status = form.querySelector("[data-role=status]");
    var file = input.files[0];
    if (!file) { return; }
    bar.hidden = false;
    function show(offset) {
      bar.value = Math.floor((offset * 100) / file.size);
      status.textContent = Math.floor((offset * 100) / file.size) + "% (" + offset + " of " + file.size + " bytes)";
    }
    function fail(answer) {
      status.textContent = "Upload stopped: " + ((answer.data && answer.data.message) || ("HTTP " + answer.status));
    }
    function next(offset, retries) {
      show(offset);
      if (offset >= file.size) { status.textContent = "Done; computing the checksum…"; window.location.reload(); return null; }
      var chunk = file.slice(offset, Math.min(offset + CHUNK, file.size));
      return call("PATCH", url, chunk, { "Content-Type": "application/octet-stream", "Upload-Offset": String(offset) })
        .then(function (answer) {
          if (answer.status === 200) { return next(answer.data.offset, 0); }
          if (answer.status === 409 || answer.status >= 500) { return resume(retries + 1, answer); }
          fail(answer);
          return null;
        }, function () { return resume(retries + 1, { status: 0, data: { message: "connection lost" } }); });
    }
    function resume(retries, answer) {
      if (retries > 8) { fail(answer); return null; }
      status.textContent = "Reconnecting…";
      return wait(Math.min(30000, 500 * Math.pow(2, retries))).then(function () {
        return call("GET", url).then(function (a) {
          if (a.status === 200 && a.data.state === "uploading") { return next(a.data.offset, retries); }
          fail(a);
          return null;
        }, function () { return resume(retries + 1, answer); });
      });
    }
    call("POST", url, JSON.stringify({ file_name: file.name, size_bytes: file.size }), { "Content-Type": "application/json" })
      .then(function (answer) {
        if (answer.status !== 200) { fail(answer); return null; }
        return next(answer.data.offset, 0);
      });
  }

  document.addEventListener("submit", function (event) {
    if (event.target && event.target.id === "dataset-upload") {
      event.preventDefault();
      upload(event.target);
    }
  });
})();
