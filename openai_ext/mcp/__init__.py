"""Remote MCP servers, called on a client's behalf: Responses' ``mcp`` tool and the Messages
API's MCP connector share this client (``client``) and its rules for where it may go
(``policy``). The official ``mcp`` SDK speaks the protocol; it is imported only when a request
names an MCP server, so a host without it loses nothing else."""
