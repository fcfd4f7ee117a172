// Starts Swagger UI on /docs. It lives in a file because the page's Content-Security-Policy
// runs no inline script; the page hands its settings over as a JSON block (#swagger-config).
"use strict";
(function () {
  const config = JSON.parse(document.getElementById("swagger-config").textContent);
  const options = Object.assign({}, config.parameters, {
    url: config.url,
    presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
  });
  if (config.oauth2RedirectUrl) options.oauth2RedirectUrl = window.location.origin + config.oauth2RedirectUrl;
  window.ui = SwaggerUIBundle(options);
})();
