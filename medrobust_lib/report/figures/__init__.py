"""Every plot the project draws."""
