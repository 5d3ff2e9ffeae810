"""The remote reward: the HTTP client (client), the reward server (serving) and their wire format
(protocol)."""
