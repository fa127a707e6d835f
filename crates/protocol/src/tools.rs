//! `build_tools_prompt`: the tools block of `agent-run-input-protocol.md`, byte for byte.

use crate::run_input::Tool;

/// Marker opening the tools block.
pub const TOOLS_START: &str = "<!-- TOOLS_START -->";
/// Marker closing the tools block.
pub const TOOLS_END: &str = "<!-- TOOLS_END -->";
/// The closing note of the block.
pub const TOOLS_NOTE: &str = "Note: tool arguments must strictly match args_schema.";

/// Renders `tools` as the prompt block the worker gives the model; empty when there are no tools.
///
/// One `- name: description` line and one `- args_schema: <compact JSON>` line per tool, keys
/// in the order the client sent them, then the note, between the markers.
pub fn build_tools_prompt(tools: &[Tool]) -> String {
    if tools.is_empty() {
        return String::new();
    }
    let mut lines = Vec::with_capacity(tools.len() * 2 + 3);
    lines.push(TOOLS_START.to_owned());
    for tool in tools {
        lines.push(format!("- {}: {}", tool.name, tool.description));
        let schema = serde_json::to_string(&tool.parameters).unwrap_or_else(|_| "{}".to_owned());
        lines.push(format!("- args_schema: {schema}"));
    }
    lines.push(TOOLS_NOTE.to_owned());
    lines.push(TOOLS_END.to_owned());
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(json: &str) -> Tool {
        serde_json::from_str(json).unwrap()
    }

    /// The seed's own example, verbatim.
    const SEED_BLOCK: &str = r#"<!-- TOOLS_START -->
- get_weather: Get current weather for a location
- args_schema: {"type":"object","properties":{"location":{"type":"string","description":"City name"},"unit":{"type":"string","enum":["celsius","fahrenheit"]}},"required":["location"]}
- searchDocuments: Search for documents
- args_schema: {"type":"object","properties":{"query":{"type":"string"}},"required":["query"]}
Note: tool arguments must strictly match args_schema.
<!-- TOOLS_END -->"#;

    #[test]
    fn the_seed_tools_render_exactly_as_the_seed_block() {
        let tools = [
            tool(
                r#"{"name": "get_weather", "description": "Get current weather for a location",
                    "parameters": {"type": "object", "properties": {
                        "location": {"type": "string", "description": "City name"},
                        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                      "required": ["location"]}}"#,
            ),
            tool(
                r#"{"name": "searchDocuments", "description": "Search for documents",
                    "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                      "required": ["query"]}}"#,
            ),
        ];
        assert_eq!(build_tools_prompt(&tools), SEED_BLOCK);
    }

    #[test]
    fn no_tools_render_nothing_at_all() {
        assert_eq!(build_tools_prompt(&[]), "");
    }
}
