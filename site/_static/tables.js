// The lessons' measured tables on a screen narrower than they are (a phone): first tighter (class "compact": smaller
// type and padding); where that is still too wide, each row shown as a block of "column: value" lines (class
// "stacked") instead of a table that scrolls sideways in its box. The header row names each value (data-label, drawn
// by accumlib.css); a table that fits stays as it is. Checked again when the page's width changes.
(function () {
  "use strict";
  function fit() {
    document.querySelectorAll("article div.cell_output table").forEach(function (table) {
      table.classList.remove("stacked", "compact");
      var fits = function () { return table.scrollWidth <= table.clientWidth + 1; };
      if (!table.rows.length || fits()) {
        return;
      }
      table.classList.add("compact");
      if (fits()) {
        return;
      }
      table.classList.remove("compact");
      var names = Array.prototype.map.call(table.rows[0].cells, function (cell) { return cell.textContent; });
      Array.prototype.slice.call(table.rows, 1).forEach(function (row) {
        Array.prototype.forEach.call(row.cells, function (cell, i) { cell.dataset.label = names[i] || ""; });
      });
      table.classList.add("stacked");
    });
  }
  document.addEventListener("DOMContentLoaded", fit);
  window.addEventListener("load", fit);  // after the fonts: a table's width can change with them
  window.addEventListener("resize", fit);
})();
