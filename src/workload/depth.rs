//! How deeply a document nests, found before it is parsed: one pass over its text, so a
//! document of `[[[[…` is refused in time linear in its size instead of costing the YAML
//! parser quadratic time before its own recursion limit.

/// Deeper than this, a document is not read (Kubernetes objects nest a few tens of levels).
pub(crate) const MAX_DEPTH: usize = 100;

/// The line (from 1, in `text`) where `text` nests deeper than [`MAX_DEPTH`]: flow
/// collections (`[`, `{`) counted where a node may start, outside quoted scalars and comments,
/// plus the `- ` entries a line starts (block nesting by indentation costs the parser no more
/// than its size, and is left to its own limit).
pub(crate) fn too_deep(text: &str) -> Option<usize> {
    let mut scan = Scan::default();
    for (i, line) in text.split('\n').enumerate() {
        if scan.line(line) > MAX_DEPTH {
            return Some(i + 1);
        }
    }
    None
}

#[derive(Default)]
struct Scan {
    /// Open flow collections.
    flow: usize,
    /// Within a quoted scalar (it may span lines): its quote.
    quote: Option<char>,
}

impl Scan {
    /// Reads one line; the deepest level it reaches.
    fn line(&mut self, line: &str) -> usize {
        let mut block = 0;
        let mut deepest = self.flow;
        // Where a node may begin: the line's start (in block context), after an indicator.
        let mut node_start = true;
        let mut chars = line.chars().peekable();
        let mut previous = ' ';
        while let Some(c) = chars.next() {
            if let Some(quote) = self.quote {
                if c == '\\' && quote == '"' {
                    chars.next();
                } else if c == quote {
                    if quote == '\'' && chars.peek() == Some(&'\'') {
                        chars.next();
                    } else {
                        self.quote = None;
                        node_start = false;
                    }
                }
                previous = c;
                continue;
            }
            match c {
                ' ' | '\t' => {}
                '#' if previous == ' ' || previous == '\t' => break,
                '"' | '\'' if node_start => self.quote = Some(c),
                '[' | '{' if node_start || self.flow > 0 => {
                    self.flow += 1;
                    deepest = deepest.max(self.flow + block);
                }
                ']' | '}' if self.flow > 0 => self.flow -= 1,
                ',' if self.flow > 0 => node_start = true,
                '-' | '?' if node_start && self.flow == 0 => {
                    let entry = chars.peek().is_none_or(|n| *n == ' ' || *n == '\t');
                    block += usize::from(entry);
                    node_start = entry;
                }
                ':' if chars.peek().is_none_or(|n| *n == ' ' || *n == '\t') || self.flow > 0 => {
                    node_start = true;
                }
                _ => node_start = false,
            }
            if !matches!(c, ' ' | '\t' | '[' | '{' | ',' | ':' | '-' | '?') {
                node_start = false;
            }
            previous = c;
        }
        deepest.max(self.flow + block)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deep_flow_and_block_nesting_is_found_at_its_line_and_ordinary_text_is_not() {
        let deep = format!("a: 1\nb: {}{}\n", "[".repeat(200_000), "]".repeat(200_000));
        assert_eq!(too_deep(&deep), Some(2));
        let json = format!("{}1{}", "[".repeat(101), "]".repeat(101));
        assert_eq!(too_deep(&json), Some(1));
        let dashes = format!("{}a\n", "- ".repeat(150));
        assert_eq!(too_deep(&dashes), Some(1));
        let fine = format!("{}1{}", "[".repeat(90), "]".repeat(90));
        assert_eq!(too_deep(&fine), None);
        // Brackets in plain and quoted scalars, comments and scripts open nothing.
        let text = "data:\n  script: if [ -f x ]; then [[ a ]]; fi\n  msg: \"[[[[[[[[[[\"\n  q: '{{{{{{{{{{''{{{{'\n  # [[[[[[[[[[[[[[[[[[[[\n  s: a[b\n".repeat(40);
        assert_eq!(too_deep(&text), None);
    }
}
