"""Built-in backend plugins. Each is registered through the `framework.backends` entry-point
group, exactly as a third-party plugin would be; the core never imports them."""
