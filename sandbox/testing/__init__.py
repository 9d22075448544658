"""Test support: stateful fakes, object builders, function clients and pytest fixture plugins."""
