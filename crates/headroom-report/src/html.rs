//! The pieces of HTML the report pages share besides the chart: escaping, a list of facts,
//! and a table people sort by clicking a column's header (a few lines of inline script, so
//! the page stays one file that fetches nothing).

use std::fmt::Write as _;

/// `text` made safe inside HTML text and attribute values.
pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// `name: value` pairs as a definition list; values are text, escaped here.
pub fn facts(facts: &[(String, String)]) -> String {
    let mut html = String::from("<dl class=\"facts\">\n");
    for (name, value) in facts {
        let _ = writeln!(html, "<dt>{}</dt><dd>{}</dd>", escape(name), escape(value));
    }
    html.push_str("</dl>\n");
    html
}

/// One cell: its HTML, and the number it sorts by where its text would sort wrongly
/// (`74.1 MiB` before `113.0 MiB`).
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    html: String,
    sort: Option<f64>,
}

impl Cell {
    /// Text, escaped, sorted as text.
    pub fn text(text: &str) -> Cell {
        Cell {
            html: escape(text),
            sort: None,
        }
    }

    /// Text, escaped, sorted by `value`.
    pub fn number(text: &str, value: f64) -> Cell {
        Cell {
            html: escape(text),
            sort: Some(value),
        }
    }

    /// HTML the caller built (and escaped), sorted by its text.
    pub fn html(html: String) -> Cell {
        Cell { html, sort: None }
    }
}

/// A table whose rows sort by the column whose header is clicked (again: the other way). The
/// address keeps the order (`#sort=peak`, `#sort=-peak` for largest first), so a sorted table
/// can be linked to, and a page opened with it comes up sorted.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    /// A `class` naming what the table lists (`jobs`, `rungs`), for styles and tests.
    pub class: &'static str,
    pub columns: Vec<&'static str>,
    pub rows: Vec<Vec<Cell>>,
}

impl Table {
    pub fn render(&self) -> String {
        let mut html = format!("<table class=\"sortable {}\">\n<thead><tr>", self.class);
        for column in &self.columns {
            let _ = write!(
                html,
                "<th data-key=\"{}\" title=\"sort by {}\">{}</th>",
                column_key(column),
                escape(column),
                escape(column)
            );
        }
        html.push_str("</tr></thead>\n<tbody>\n");
        for row in &self.rows {
            html.push_str("<tr>");
            for cell in row {
                match cell.sort {
                    Some(value) => {
                        let _ = write!(html, "<td data-sort=\"{value}\">{}</td>", cell.html);
                    }
                    None => {
                        let _ = write!(html, "<td>{}</td>", cell.html);
                    }
                }
            }
            html.push_str("</tr>\n");
        }
        html.push_str("</tbody>\n</table>\n");
        html
    }
}

/// The name a column goes by in the address: `OOM retries` is `oom-retries`.
fn column_key(column: &str) -> String {
    column
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|word| !word.is_empty())
        .map(str::to_ascii_lowercase)
        .collect::<Vec<_>>()
        .join("-")
}

/// Sorts every `table.sortable` of the page on a click on a header, and once when the page
/// opens with `#sort=KEY` or `#sort=-KEY` in its address.
pub const SORT_SCRIPT: &str = r##"<script>
for (const table of document.querySelectorAll("table.sortable")) {
  const heads = [...table.tHead.rows[0].cells];
  const sort = (head, descending) => {
    const index = heads.indexOf(head);
    const key = (row) => {
      const cell = row.cells[index];
      return cell.dataset.sort === undefined ? cell.textContent : Number(cell.dataset.sort);
    };
    const rows = [...table.tBodies[0].rows].sort((a, b) => {
      const [x, y] = [key(a), key(b)];
      const order = typeof x === "number" ? x - y : x.localeCompare(y);
      return descending ? -order : order;
    });
    table.tBodies[0].append(...rows);
    for (const other of heads) other.removeAttribute("aria-sort");
    head.setAttribute("aria-sort", descending ? "descending" : "ascending");
  };
  for (const head of heads) {
    head.addEventListener("click", () => {
      const descending = head.getAttribute("aria-sort") === "ascending";
      sort(head, descending);
      history.replaceState(null, "", "#sort=" + (descending ? "-" : "") + head.dataset.key);
    });
  }
  const wanted = /^#sort=(-?)(.+)$/.exec(location.hash);
  const head = wanted && heads.find((candidate) => candidate.dataset.key === wanted[2]);
  if (head) sort(head, wanted[1] === "-");
}
</script>
"##;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_are_escaped_and_numbers_carry_their_sort_key() {
        let table = Table {
            class: "jobs",
            columns: vec!["label", "OOM retries"],
            rows: vec![vec![Cell::text("a<b>.o"), Cell::number("1 KiB", 1024.0)]],
        };
        let html = table.render();
        assert!(html.contains(r#"<th data-key="oom-retries" title="sort by OOM retries">"#));
        assert!(html.contains("<td>a&lt;b&gt;.o</td><td data-sort=\"1024\">1 KiB</td>"));
        assert!(facts(&[("cwd".into(), "/src/<x>".into())]).contains("<dd>/src/&lt;x&gt;</dd>"));
    }
}
